"""How the decoder splits: into pipeline stages (by blocks) and over tensor-parallel ranks.

Pipeline: the embedding on the first stage, the tied output layer (the same embedding) on the
last; stages hold the very modules (and weights) the whole model trains.

Tensor parallelism as Megatron-LM splits a transformer, on DTensor: in each block Q, K and V by
columns (each rank computes its share of the heads), the attention's output projection by rows;
the FFN's first layer by columns, its second by rows. A row-parallel layer's partial results are
summed by one all-reduce in forward; the block's input gradient by one all-reduce in backward (the
three column-parallel projections share one input, so it is made a replicated DTensor once, at the
attention's entry): 2 all-reduces of b*s*h forward and 2 backward per block and micro-batch.
Embeddings and norms stay whole: their inputs and gradients are the same on every rank.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    parallelize_module,
)

from runner.models.decoder.model import Block, Decoder


class DecoderStage(nn.Module):
    """Blocks of the decoder; the first stage embeds, the last one projects to the vocabulary."""

    def __init__(self, model: Decoder, blocks: range, first: bool, last: bool) -> None:
        super().__init__()
        self.first, self.last, self.d_model = first, last, model.d_model
        self.embed = model.embed if first or last else None  # tied: the last stage's output layer
        if first:
            self.register_buffer("pos", model.pos, persistent=False)
            self.dropout = model.dropout
        self.blocks = nn.ModuleList(model.blocks[i] for i in blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:
            x = self.dropout(self.embed(x) * math.sqrt(self.d_model) + self.pos[: x.shape[1]])
        for block in self.blocks:
            x = block(x)
        return x @ self.embed.weight.T if self.last else x


def stage_example(
    model: Decoder, first: bool, last: bool, microbatch: int, seq_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    hidden = (microbatch, seq_len, model.d_model)
    out = (microbatch, seq_len, model.embed.num_embeddings) if last else hidden
    tokens = torch.empty(microbatch, seq_len, dtype=torch.long, device="meta")
    x = tokens if first else torch.empty(hidden, device="meta", requires_grad=True)
    return x, torch.empty(out, device="meta", requires_grad=True)


def block_plan() -> dict[str, object]:
    return {
        "attn": PrepareModuleInput(
            input_layouts=(Replicate(),),
            desired_input_layouts=(Replicate(),),
            use_local_output=False,  # Q, K, V take one replicated input: one backward all-reduce
        ),
        "attn.q_proj": ColwiseParallel(),
        "attn.k_proj": ColwiseParallel(),
        "attn.v_proj": ColwiseParallel(),
        "attn.o_proj": RowwiseParallel(),
        "ffn.up": ColwiseParallel(),
        "ffn.down": RowwiseParallel(),
    }


def parallelize(module: nn.Module, mesh: DeviceMesh) -> nn.Module:
    """Split every block of `module` (the whole decoder or one stage) over the 1-D mesh."""
    for block in [m for m in module.modules() if isinstance(m, Block)]:
        parallelize_module(block, mesh, block_plan())
    return module
