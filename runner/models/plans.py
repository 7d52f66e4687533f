"""A tensor-parallel plan any stack of Linear layers can use: consecutive pairs, the first split by
columns and the second by rows (Megatron's MLP), so each pair needs one all-reduce forward (the row
layer's output) and one backward (the column layer's input gradient). An odd last layer stays
whole on every rank."""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


def split_linear_pairs(module: nn.Module, mesh: DeviceMesh) -> nn.Module:
    linears = [m for m in module.modules() if isinstance(m, nn.Linear)]
    for column in range(0, len(linears) - 1, 2):
        parallelize_module(linears[column], mesh, ColwiseParallel())
        parallelize_module(linears[column + 1], mesh, RowwiseParallel())
    return module
