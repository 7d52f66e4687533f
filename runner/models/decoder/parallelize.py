"""How the decoder splits: into pipeline stages (by blocks) and over tensor-parallel ranks.

Pipeline: the embedding on the first stage, the tied output layer (the same embedding) on the
last; stages hold the very modules (and weights) the whole model trains.

Tensor parallelism as Megatron-LM splits a transformer, on DTensor: in each block Q, K and V by
columns (each rank computes its share of the heads), the attention's output projection by rows;
the FFN's first layer by columns, its second by rows. A row-parallel layer's partial results are
summed by one all-reduce in forward; the block's input gradient by one all-reduce in backward (the
three column-parallel projections share one input, so it is made a replicated DTensor once, at the
attention's entry): 2 all-reduces of b*s*h forward and 2 backward per block and micro-batch.
Norms stay whole: their inputs and gradients are the same on every rank.

Sequence parallelism (`parallel.sequence_parallel`, Megatron-LM's, on the same tp ranks): the
residual stream between the split layers (the norms, the residual adds, dropout) is split along
the sequence, Shard(1), each rank holding s/tp of every sample's positions. An all-gather of the
stream (b*s*h) before the attention's and the FFN's column-parallel layers, and a reduce-scatter
of the row-parallel layers' outputs (b*s*h) into the stream, replace each all-reduce; backward
swaps the two. The stream enters the first block by a plain split (its backward: an all-gather)
and leaves the last one by an all-gather (its backward: nothing, or with the vocabulary split a
reduce-scatter of the output layer's partial input gradient). The norms' weights stay whole: their
gradients, partial on each rank's positions, are all-reduced.

Vocabulary parallelism (`parallel.vocab_parallel`, Megatron-LM's): the embedding matrix is split
by rows, vocab/tp each. The embedding looks up the rows a rank holds (the others masked to zero)
and one all-reduce of b*s*h sums them in forward (RowwiseParallel on nn.Embedding). The tied output
layer multiplies a replicated input by the same Shard(0) weight: logits sharded on the vocabulary
(Shard(-1)), no collective in forward; in backward its input gradient is partial on every rank and
one all-reduce of b*s*h sums it. Cross-entropy then runs on the sharded logits (torch's
loss_parallel, runner/losses.py): three all-reduces of b*s in forward (the max, the sum of
exponentials, the target's logit), none in backward. Without it the embedding stays whole on
every rank, and every rank computes all the logits.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from runner.models.decoder.model import Block, Decoder


class DecoderStage(nn.Module):
    """Blocks of the decoder; the first stage embeds, the last one projects to the vocabulary."""

    def __init__(self, model: Decoder, blocks: range, first: bool, last: bool) -> None:
        super().__init__()
        self.first, self.last, self.d_model = first, last, model.d_model
        self.embed = model.embed if first or last else None  # tied: the last stage's output layer
        self.head = model.head if last else None
        if first:
            self.register_buffer("pos", model.pos, persistent=False)
            self.dropout = model.dropout
        self.blocks = nn.ModuleList(model.blocks[i] for i in blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:
            x = self.dropout(self.embed(x) * math.sqrt(self.d_model) + self.pos[: x.shape[1]])
        for block in self.blocks:
            x = block(x)
        if self.last:
            return self.head(x, self.embed.weight)
        # Sequence parallelism's split stream: the next stage gets this rank's positions
        return x.to_local() if isinstance(x, DTensor) else x


def stage_example(
    model: Decoder, first: bool, last: bool, microbatch: int, seq_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    hidden = (microbatch, seq_len, model.d_model)
    out = (microbatch, seq_len, model.embed.num_embeddings) if last else hidden
    tokens = torch.empty(microbatch, seq_len, dtype=torch.long, device="meta")
    x = tokens if first else torch.empty(hidden, device="meta", requires_grad=True)
    return x, torch.empty(out, device="meta", requires_grad=True)


def block_plan(ffn: bool = True) -> dict[str, object]:
    """A block's split; `ffn` false: its attention only (a mixture of experts' FFN stays whole
    on every tensor-parallel rank: runner/models/moe/)."""
    attention = {
        "attn": PrepareModuleInput(
            input_layouts=(Replicate(),),
            desired_input_layouts=(Replicate(),),
            use_local_output=False,  # Q, K, V take one replicated input: one backward all-reduce
        ),
        "attn.q_proj": ColwiseParallel(),
        "attn.k_proj": ColwiseParallel(),
        "attn.v_proj": ColwiseParallel(),
        "attn.o_proj": RowwiseParallel(),
    }
    return attention | ({"ffn.up": ColwiseParallel(), "ffn.down": RowwiseParallel()} if ffn else {})


def sequence_plan() -> dict[str, object]:
    """A block's plan with the stream split along the sequence (Shard(1)) outside the split
    layers: gathered into each sub-layer, its row-parallel output scattered back."""
    gathered = PrepareModuleInput(
        input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),), use_local_output=False
    )
    return {
        "norm1": SequenceParallel(),
        "norm2": SequenceParallel(),
        "attn": gathered,
        "attn.q_proj": ColwiseParallel(),
        "attn.k_proj": ColwiseParallel(),
        "attn.v_proj": ColwiseParallel(),
        "attn.o_proj": RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
        "ffn": gathered,
        "ffn.up": ColwiseParallel(),
        "ffn.down": RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
    }


def parallelize(
    module: nn.Module, mesh: DeviceMesh, vocab_parallel: bool = False, sequence: bool = False,
    ffn: bool = True,
) -> nn.Module:  # fmt: skip
    """Split every block of `module` (the whole decoder or one stage) over the 1-D mesh; with
    `vocab_parallel` its embedding and output layer by vocabulary rows; with `sequence` the
    stream between the split layers along the sequence (stages hand it on split); `ffn` false:
    the blocks' attention only."""
    blocks = [m for m in module.modules() if isinstance(m, Block)]
    for block in blocks:
        parallelize_module(block, mesh, sequence_plan() if sequence else block_plan(ffn))
        if sequence:
            summed_at_backward(block.norm1, block.norm2)
    if sequence and blocks:
        split_sequence(blocks, mesh, embedded=getattr(module, "first", True))
    if vocab_parallel:
        split_vocabulary(module, mesh, sequence)
    elif sequence and module.head is not None:  # a pipeline's last stage, or the whole
        # Every rank computes all the logits, from the whole stream
        whole = PrepareModuleInput(
            input_layouts=(Shard(1), None),
            desired_input_layouts=(Replicate(), None),
            use_local_output=True,
        )
        parallelize_module(module.head, mesh, whole)
    return module


def split_context(module: nn.Module, attention: object, positions: list[int]) -> nn.Module:
    """Context parallelism: `module` (the whole decoder or one stage) runs on this rank's
    positions of every sample, the strategy handing it those tokens (runner/layouts/context/
    split.py). The embedding adds those positions' encodings; every block attends through
    `attention`, which sees the other ranks' keys and values. The weights stay whole."""
    if getattr(module, "pos", None) is not None:  # the whole decoder, or the first stage
        module.pos = module.pos[torch.tensor(positions)]  # not saved: snapshots are unchanged
    for block in (m for m in module.modules() if isinstance(m, Block)):
        block.attn.attend = attention
    return module


def summed_at_backward(*norms: nn.Module) -> None:
    """A norm's weights are whole on every rank, but each rank's gradient comes from its own
    positions: partial. Summed as backward makes it (one all-reduce a weight and micro-batch);
    left partial, every optimizer operation that reads it would all-reduce it again."""
    for weight in [p for norm in norms for p in norm.parameters()]:
        weight.register_hook(lambda grad, w=weight: grad.redistribute(placements=w.placements))


def split_sequence(blocks: list[nn.Module], mesh: DeviceMesh, embedded: bool = True) -> None:
    """The stream enters the first block split along the sequence: each rank keeps its positions
    of the embedding's output, which is whole on every rank (no collective forward). A later
    pipeline stage (not `embedded`) receives it split already: its positions, as they are."""
    split = PrepareModuleInput(
        input_layouts=(Replicate() if embedded else Shard(1),),
        desired_input_layouts=(Shard(1),),
        use_local_output=False,
    )
    parallelize_module(blocks[0], mesh, split)


def split_vocabulary(module: nn.Module, mesh: DeviceMesh, sequence: bool = False) -> None:
    """One Shard(0) DTensor weight serves both ends: the embedding's lookup (the token ids are
    the same on every rank) and the output layer, which takes it as it is and the hidden states
    as replicated. Both uses add their gradients into that one parameter's shard (under DDP, into
    its local tensor: runner/compat/ddp_dtensor.py). The logits stay a DTensor, for the loss."""
    embed, head = getattr(module, "embed", None), getattr(module, "head", None)
    if embed is not None:
        parallelize_module(embed, mesh, RowwiseParallel(input_layouts=Replicate()))
        weight = embed.weight
        # DTensor's embedding backward has no row-wise rule (torch 2.13): it gives the weight a
        # Replicate gradient, each rank scattering into all V rows (its inputs are replicated,
        # so no collective). Kept as the parameter's own rows, it is the shard the optimizer and
        # the pipeline's tied all-reduce expect; chunking is local. (Under DDP the parameter is
        # the local shard, and DTensor.from_local's backward chunks the same way.)
        weight.register_hook(lambda grad: grad.redistribute(placements=weight.placements))
    if head is not None:
        layouts = (Replicate(), Shard(0))
        stream = (Shard(1) if sequence else Replicate(), Shard(0))  # gathered when split
        prepare = PrepareModuleInput(
            input_layouts=stream, desired_input_layouts=layouts, use_local_output=False
        )
        parallelize_module(head, mesh, prepare)
