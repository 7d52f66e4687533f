"""The dispatch and combine of expert parallelism: a mixture of experts' rows, grouped by expert
(runner/models/moe/model.py), all-to-all over the ep ranks, so that each rank runs its own
experts on every rank's tokens, and back.

Dropless routing sends each rank's rows for another rank's experts as they are, however many
the router sent there: the ranks first tell each other how many rows of each expert they send
(an all-to-all of n_experts counts), then the rows go in variable-size all-to-alls
(Megatron-Core's and torchtitan's token dispatch), and the combine returns them the same way.
Switch's capacity fixes every expert's rows, so no counts are sent. Each all-to-all is timed and
recorded with its payload (S as nccl-tests names it: what the rank sends), forward and backward
alike: the layer waits for it."""

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


def _all_to_all(
    x: torch.Tensor, sends: list[int], gets: list[int], group: dist.ProcessGroup, what: str
) -> torch.Tensor:
    """sends[i] of x's rows, in order, to rank i of the group; gets[j] rows from rank j."""
    x = x.contiguous()
    out = x.new_empty(sum(gets), *x.shape[1:])
    start = clock.stamp()
    dist.all_to_all_single(out, x, gets, sends, group=group)
    for record in _recorders:
        record(Transfer("ep", what, start, clock.stamp(), x.numel() * x.element_size()))
    return out


class AllToAll(torch.autograd.Function):
    """An all-to-all whose backward is the all-to-all of the gradients, the other way."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, x: torch.Tensor, sends: list[int], gets: list[int], group: dist.ProcessGroup
    ) -> torch.Tensor:
        ctx.sends, ctx.gets, ctx.group = sends, gets, group
        return _all_to_all(x, sends, gets, group, "ep all-to-all")

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        return _all_to_all(grad, ctx.gets, ctx.sends, ctx.group, "ep all-to-all"), None, None, None


class ExpertExchange:
    """Runs a rank's experts (n / ep of them) on the rows of every ep rank: the mixture of
    experts' `exchange`. Not a module: the experts stay the block's own (their names, once)."""

    def __init__(self, experts: nn.Module, group: dist.ProcessGroup, ep: int, fixed: bool) -> None:
        self.experts, self.group, self.ep = experts, group, ep
        self.fixed = fixed  # Switch's capacity: every rank's rows per expert are the same

    def counts(self, counts: list[int], device: torch.device) -> torch.Tensor:
        """Rows of each of this rank's experts from each ep rank, (ep, n / ep)."""
        mine = torch.tensor(counts, dtype=torch.int64, device=device).view(self.ep, -1)
        if self.fixed:
            return mine
        each = [len(counts) // self.ep] * self.ep
        return _all_to_all(mine.view(-1, 1), each, each, self.group, "ep counts all-to-all").view(
            self.ep, -1
        )

    def __call__(self, rows: torch.Tensor, counts: list[int]) -> torch.Tensor:
        mine = len(counts) // self.ep
        sends = [sum(counts[i * mine : (i + 1) * mine]) for i in range(self.ep)]
        got = self.counts(counts, rows.device)
        gets = got.sum(1).tolist()
        # dispatch: from each rank, its rows for this rank's experts, grouped by expert
        arrived = AllToAll.apply(rows, sends, gets, self.group)
        expert = (
            torch.arange(mine, device=got.device).repeat(self.ep).repeat_interleave(got.view(-1))
        )
        order = expert.argsort(stable=True)
        done = self.experts(arrived[order], got.sum(0).tolist())
        back = torch.empty_like(done).index_copy(0, order, done)
        # combine: each rank's rows back from the ranks that ran them
        return AllToAll.apply(back, gets, sends, self.group)
