"""Tensor parallelism as Megatron-LM splits a transformer, on DTensor: `parallelize(model, mesh)`.

In each decoder block, Q, K and V are split by columns (each rank computes its share of the heads)
and the attention's output projection by rows; the FFN's first layer by columns, its second by rows.
A row-parallel layer's partial results are summed by one all-reduce in forward; the block's input
gradient by one all-reduce in backward (the three column-parallel projections share one input, so
it is made a replicated DTensor once, at the attention's entry). Per block and micro-batch that is
Megatron's count: 2 all-reduces of b*s*h forward and 2 backward. The FFNN's Linear layers are split
in such column/row pairs. Embeddings, norms and an odd last layer stay whole on every rank: their
inputs and gradients are the same everywhere, so they need no communication.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    parallelize_module,
)

from runner.models.decoder import Block
from runner.models.sizes import column_row_pairs


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


def parallelize(model: nn.Module, mesh: DeviceMesh) -> nn.Module:
    """Split `model` (a whole model or one pipeline stage) over the 1-D tensor-parallel mesh."""
    blocks = [m for m in model.modules() if isinstance(m, Block)]
    for block in blocks:
        parallelize_module(block, mesh, block_plan())
    if blocks:
        return model
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    for column, row in column_row_pairs(range(len(linears))):
        parallelize_module(linears[column], mesh, ColwiseParallel())
        parallelize_module(linears[row], mesh, RowwiseParallel())
    return model
