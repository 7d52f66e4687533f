"""Every collective DTensor runs, timed, with its payload: tensor parallelism's communication.

DTensor sums partial results and gathers shards through torch's functional collectives, called by
module attribute (`funcol.all_reduce(...)`), in forward and in backward alike. Wrapping those
functions sees every one that really runs. Each call is waited for at once: the layer needs its
result before it can go on, so this moves no waiting, and the span is the time the rank was blocked.
Payload S as nccl-tests names it: the input of an all-reduce or reduce-scatter, the output of an
all-gather. With sequence parallelism the all-gathers and reduce-scatters are its own (dimension
"sp", on the same ranks): tensor parallelism alone runs none on its ranks.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from runner import clock
from runner.compat.collectives import async_tensor_type, wrap_functional
from runner.layouts.probes import Recorder, Transfer
from runner.models import recompute

# candidate function names, newest first -> (the timeline's name, does the payload count the output
# rather than the input). Only the first present is wrapped (runner/compat/collectives.py): torch
# 2.13's deprecated *_tensor aliases call the *_single functions; older releases have only *_tensor.
WRAPPED = {
    ("all_reduce",): ("all-reduce", False),
    ("all_gather_single", "all_gather_tensor"): ("all-gather", True),
    ("reduce_scatter_single", "reduce_scatter_tensor"): ("reduce-scatter", False),
}
SEQUENCE = ("all-gather", "reduce-scatter")  # sequence parallelism's, where it is on
_recorders: list[Recorder] = []
_sequence = [False]  # this job's: parallel.sequence_parallel


def install(record: Recorder, sequence: bool = False) -> None:
    """Route DTensor's collectives to `record` (the wrapping happens once per process)."""
    if not _recorders:
        wrap_functional({names: _timing(kind, output) for names, (kind, output) in WRAPPED.items()})
    _recorders[:] = [record]
    _sequence[0] = sequence


def dim_of(kind: str) -> str:
    return "sp" if _sequence[0] and kind in SEQUENCE else "tp"


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _timing(kind: str, output: bool) -> Callable[[Callable], Callable]:
    return lambda collective: _timed(collective, kind, output)


def _timed(collective: Callable, kind: str, output: bool) -> Callable:
    waitable = async_tensor_type()

    @functools.wraps(collective)
    def timed(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if recompute.replayed(kind):  # selective recomputation hands back the saved output
            return collective(tensor, *args, **kwargs)
        start = clock.stamp()
        out = collective(tensor, *args, **kwargs)
        if isinstance(out, waitable):
            out = out.wait()  # on a GPU: the stream waits for it, and the stamp is behind it
        end, size = clock.stamp(), _nbytes(out if output else tensor)
        dim = dim_of(kind)
        _recorders[0](Transfer(dim, f"{dim} {kind}", start, end, size))
        return out

    return timed
