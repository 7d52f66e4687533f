"""Sharded data parallelism's probe: every all-gather and reduce-scatter FSDP2 runs, and ZeRO-1's
broadcast of the updated weights, timed, with its payload.

FSDP2 takes custom collectives (`set_custom_all_gather`, `set_custom_reduce_scatter`); these are
its defaults with stamps around them. Payload S as nccl-tests names it: an all-gather's output, a
reduce-scatter's input. Where the call returns at once and the rank waits later (a prefetched
all-gather on a CPU: gloo runs it in its own thread while the rank computes), the span is the
collective's time in flight, and the wait is recorded apart, as a blocking transfer of no bytes:
what the rank really lost to it. On a GPU FSDP2 runs them on streams of their own: the stamps are
events on those streams, the time on the wire; what the compute stream waits for them is not
measured apart there (docs/measurement.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from runner import clock
from runner.compat.fsdp import DefaultAllGather, DefaultReduceScatter
from runner.layouts.probes import Recorder, Transfer


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class TimedWork(dist.Work):
    """An asynchronous collective: its end is stamped when it completes, and the rank's wait for
    it is recorded as blocking."""

    def __init__(self, work: dist.Work, kind: str, start: Any, nbytes: int, record: Recorder):
        super().__init__()
        self.work, self.kind, self.start, self.nbytes, self.record = (
            work, kind, start, nbytes, record,
        )  # fmt: skip
        self.done: Any = None
        work.get_future().then(self._completed)

    def _completed(self, fut: torch.futures.Future) -> Any:
        self.done = clock.stamp()
        return fut.value()

    def wait(self, timeout: Any = None) -> bool:
        waiting = clock.stamp()
        self.work.wait()
        waited = clock.stamp()
        end = self.done if self.done is not None else waited
        self.record(Transfer("dp", self.kind, self.start, end, self.nbytes, apart=True))
        self.record(Transfer("dp", "dp wait", waiting, waited))
        return True

    def is_completed(self) -> bool:
        return self.work.is_completed()


class Timed:
    """Stamps around a collective FSDP2 calls; `kind`: the timeline's name."""

    kind = ""

    def __init__(self, record: Recorder, gpu: bool) -> None:
        super().__init__()
        self.record, self.gpu = record, gpu

    def timed(self, call: Callable[[], Any], nbytes: int) -> Any:
        start = clock.stamp()
        work = call()
        if work is not None:
            return TimedWork(work, self.kind, start, nbytes, self.record)
        # Returned done: on a CPU the rank was blocked for it; on a GPU it ran on its own stream.
        end, gpu = clock.stamp(), self.gpu
        self.record(Transfer("dp", self.kind, start, end, nbytes, blocking=not gpu, apart=gpu))
        return None


class TimedAllGather(Timed, DefaultAllGather):
    kind = "dp all-gather"

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                 group: dist.ProcessGroup, async_op: bool = False) -> Any:  # fmt: skip
        gather = super().__call__
        return self.timed(lambda: gather(output_tensor, input_tensor, group, async_op),
                          _nbytes(output_tensor))  # fmt: skip


class TimedReduceScatter(Timed, DefaultReduceScatter):
    kind = "dp reduce-scatter"

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                 group: dist.ProcessGroup, op: Any, async_op: bool = False) -> Any:  # fmt: skip
        scatter = super().__call__
        return self.timed(lambda: scatter(output_tensor, input_tensor, group, op, async_op),
                          _nbytes(input_tensor))  # fmt: skip


def install(fsdp_modules: list[Any], record: Recorder, gpu: bool) -> None:
    """Every FSDP module's all-gathers and reduce-scatters go through the timed ones."""
    for module in fsdp_modules:
        module.set_custom_all_gather(TimedAllGather(record, gpu))
        module.set_custom_reduce_scatter(TimedReduceScatter(record, gpu))
