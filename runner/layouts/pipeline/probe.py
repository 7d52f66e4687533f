"""Every schedule action of torch.distributed.pipelining, timed on this rank, and the bytes sent.

Wraps what really runs: each stage's forward, backward and weight-gradient work per micro-batch,
and the schedule module's batched P2P calls (bytes of every send) and waits (time blocked).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from runner import clock
from runner.compat.pipelining import wrap_p2p
from runner.layouts.probes import Action, Transfer

COMPUTE = {"forward_one_chunk": "F", "backward_one_chunk": "B", "backward_weight_one_chunk": "W"}


class PipelineTrace:
    def __init__(self) -> None:
        self.actions: list[Action] = []
        self.sent_bytes = 0
        # Each batch of sends, from its launch to the end of the wait for it (its bandwidth).
        self.launched: dict[int, tuple[object, int]] = {}
        self.sends: list[Transfer] = []

    def instrument(self, stages: list[Any]) -> None:
        for stage in stages:
            for method, kind in COMPUTE.items():
                setattr(stage, method, self._timed(getattr(stage, method), kind, stage.stage_index))
        _install(self)

    def _timed(self, fn: Callable, kind: str, stage: int) -> Callable:
        @functools.wraps(fn)
        def timed(chunk: int, *args: Any, **kwargs: Any) -> Any:
            start = clock.stamp()
            out = fn(chunk, *args, **kwargs)
            self.actions.append(Action(f"{kind}{stage}", start, clock.stamp(), chunk))
            return out

        return timed

    def take(self) -> tuple[list[Action], int, list[Transfer]]:
        """This step's actions, bytes sent and sends, and a fresh start for the next step."""
        taken = self.actions, self.sent_bytes, self.sends
        self.actions, self.sent_bytes, self.sends, self.launched = [], 0, [], {}
        return taken


_active: list[PipelineTrace] = []


def _install(trace: PipelineTrace) -> None:
    """Route the schedule module's P2P calls through this rank's trace (once per process)."""
    if not _active:
        wrap_p2p(_counting, _waiting)
    _active[:] = [trace]


def _counting(batch_p2p: Callable) -> Callable:
    @functools.wraps(batch_p2p)
    def counting(ops: list[dist.P2POp], *args: Any, **kwargs: Any) -> Any:
        trace, start = _active[0], clock.stamp()
        sent = sum(
            op.tensor.numel() * op.tensor.element_size() for op in ops if op.op is dist.isend
        )
        trace.sent_bytes += sent
        works = batch_p2p(ops, *args, **kwargs)
        if sent:
            trace.launched[id(works)] = (start, sent)
        return works

    return counting


def _waiting(wait: Callable) -> Callable:
    @functools.wraps(wait)
    def waiting(works: Any) -> Any:
        trace, start = _active[0], clock.stamp()
        out = wait(works)  # on a GPU: the stream waits, and the second stamp is behind it
        end = clock.stamp()
        trace.actions.append(Action("wait", start, end, -1))
        launched = trace.launched.pop(id(works), None)
        if launched is not None:
            trace.sends.append(Transfer("pp", "p2p", launched[0], end, launched[1], False))
        return out

    return waiting
