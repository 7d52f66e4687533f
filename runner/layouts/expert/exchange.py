"""The dispatch and combine of expert parallelism: a mixture of experts' slots (experts x capacity
x d_model, runner/models/moe/model.py) all-to-all over the ep ranks, so that each rank runs its own
experts on every rank's tokens, and back. Each all-to-all is timed and recorded with its payload
(S as nccl-tests names it: the input), forward and backward alike: the layer waits for it."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from runner import clock
from runner.layouts.probes import Recorder, Transfer

_recorders: list[Recorder] = []


def install(record: Recorder) -> None:
    """Route the exchanges' records to `record` (this process's job's)."""
    _recorders[:] = [record]


def _all_to_all(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Chunk i of x's first dimension to rank i of the group; chunk j of the result from rank j."""
    x = x.contiguous()
    out = torch.empty_like(x)
    start = clock.stamp()
    dist.all_to_all_single(out, x, group=group)
    for record in _recorders:
        record(Transfer("ep", "ep all-to-all", start, clock.stamp(), x.numel() * x.element_size()))
    return out


class AllToAll(torch.autograd.Function):
    """An all-to-all whose backward is the all-to-all of the gradients, the other way."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:  # type: ignore[override]
        ctx.group = group
        return _all_to_all(x, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        return _all_to_all(grad, ctx.group), None


class ExpertExchange:
    """Runs a rank's experts (n / ep of them) on the slots of every ep rank: the mixture of
    experts' `exchange`. Not a module: the experts stay the block's own (their names, once)."""

    def __init__(self, experts: nn.Module, group: dist.ProcessGroup, ep: int) -> None:
        self.experts, self.group, self.ep = experts, group, ep

    def agree(self, busiest: int) -> int:
        """Dropless routing's slots per expert: the busiest expert's load on any ep rank, so that
        every rank's buffer has the same shape (one all-reduce of one number)."""
        load = torch.tensor([busiest], dtype=torch.int64)
        dist.all_reduce(load, op=dist.ReduceOp.MAX, group=self.group)
        return int(load.item())

    def __call__(self, slots: torch.Tensor) -> torch.Tensor:
        n, capacity, d = slots.shape
        mine = n // self.ep
        # dispatch: rank j gets every rank's slots of its experts, (ranks, mine, capacity, d)
        got = AllToAll.apply(slots.view(self.ep, mine, capacity, d), self.group)
        per_expert = got.transpose(0, 1).reshape(mine, self.ep * capacity, d)
        out = self.experts(per_expert).view(mine, self.ep, capacity, d).transpose(0, 1)
        # combine: each rank's slots back from the ranks that ran them
        return AllToAll.apply(out, self.group).view(n, capacity, d)
