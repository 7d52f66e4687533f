"""Sampled profiler traces: one step in every `trainer.profile_every_n_steps`, on every rank, taken
with torch.profiler (CUPTI's kernels on a GPU, the operators on a CPU) and read as Holistic Trace
Analysis reads a trace:

- busy: some kernel running; idle: none. `device_idle_fraction` = idle / the step.
- compute kernels: every kernel but communication's (and, on a GPU, memory copies and sets);
  `device_compute_fraction` = the time some compute kernel ran / the step.
- communication kernels: NCCL's on a GPU; gloo's collectives, run on gloo's own threads, on a CPU;
  `device_comm_fraction` = the time some ran / the step.
- `comm_overlap_fraction`: the communication time during which compute ran too / the
  communication time.

On a CPU a kernel is an aten operator on the rank's main thread: Python between operators counts
as idle, as launch gaps do on a GPU. So the trace's compute is at most what the timing hooks call
compute (the phases' whole spans); the difference is the framework's own time.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from statistics import fmean
from typing import Any

from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

from runner.intervals import Interval, clipped, overlap_s, union_s
from runner.metrics import (
    COMM_OVERLAP_FRACTION,
    DEVICE_COMM_FRACTION,
    DEVICE_COMPUTE_FRACTION,
    DEVICE_IDLE_FRACTION,
    PROFILED,
)

STEP = "runner: profiled step"


def breakdown(window: Interval, compute: list[Interval], comm: list[Interval]) -> dict[str, float]:
    """HTA's temporal breakdown of one step, from its kernels' intervals."""
    compute, comm = clipped(compute, window), clipped(comm, window)
    step = window[1] - window[0]
    comm_s = union_s(comm)
    return {
        DEVICE_IDLE_FRACTION.name: 1 - union_s(compute + comm) / step,
        DEVICE_COMPUTE_FRACTION.name: union_s(compute) / step,
        DEVICE_COMM_FRACTION.name: comm_s / step,
        COMM_OVERLAP_FRACTION.name: overlap_s(comm, compute) / comm_s if comm_s else 0.0,
    }


def span(event: Any) -> Interval:
    return event.time_range.start / 1e6, event.time_range.end / 1e6


def kernels(events: list[Any], cuda: bool) -> tuple[Interval, list[Interval], list[Interval]]:
    """The step's window, its compute kernels and its communication kernels, in seconds."""
    step = next(e for e in events if e.name == STEP)
    if cuda:
        device = [e for e in events if e.device_type == DeviceType.CUDA]
        comm = [span(e) for e in device if "nccl" in e.name.lower()]
        memory = ("memcpy", "memset")
        compute = [
            span(e)
            for e in device
            if "nccl" not in e.name.lower() and not any(m in e.name.lower() for m in memory)
        ]
    else:
        comm = [span(e) for e in events if e.name.startswith("gloo:")]
        compute = [
            span(e) for e in events if e.thread == step.thread and e.name.startswith("aten::")
        ]
    return span(step), compute, comm


class SampledProfile:
    """Profiles the steps it is told to, one at a time; keeps each one's breakdown and the last
    one's trace (Chrome's format)."""

    def __init__(self, every: int, cuda: bool) -> None:
        self.every, self.cuda = every, cuda
        self.profiler: Any = None
        self.step: Any = None
        self.found: list[dict[str, float]] = []
        self.trace: dict[str, Any] | None = None

    def wants(self, step: int) -> bool:
        return self.every > 0 and (step + 1) % self.every == 0

    def start(self) -> None:
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        self.profiler = profile(activities=activities)
        self.profiler.__enter__()
        self.step = record_function(STEP)
        self.step.__enter__()

    def stop(self) -> None:
        """After the step's stamps are read (on a GPU: its kernels have all run)."""
        if self.profiler is None:
            return
        self.step.__exit__(None, None, None)
        self.profiler.__exit__(None, None, None)
        self.found.append(breakdown(*kernels(list(self.profiler.events()), self.cuda)))
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "trace.json"
            self.profiler.export_chrome_trace(str(path))
            self.trace = json.loads(path.read_text())
        self.profiler = self.step = None

    def summary(self) -> dict[str, float]:
        if not self.found:
            return {}
        return {fig.name: fmean(f[fig.name] for f in self.found) for fig in PROFILED}


def merged_trace(traces: list[dict[str, Any] | None]) -> dict[str, Any]:
    """Every rank's sampled step in one trace that Perfetto opens: a process per rank."""
    events = []
    for rank, trace in enumerate(traces):
        if not trace:
            continue
        events.append(
            {"name": "process_name", "ph": "M", "pid": rank, "args": {"name": f"rank {rank}"}}
        )
        for e in trace.get("traceEvents", []):
            if isinstance(e, dict) and e.get("ph") != "M":
                events.append(e | {"pid": rank})
    return {"traceEvents": events, "displayTimeUnit": "ms"}
