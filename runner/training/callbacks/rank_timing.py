"""Where each rank's step time goes: compute, blocked in communication, idle; and bytes sent.

Timed from what really runs. Lightning's hooks bound forward, backward and optimizer work; the
layouts' probes record every transfer the rank takes part in (runner/layouts/probes.py: a DDP
bucket's all-reduce, overlapped with backward; a tensor-parallel collective, blocking inside a
layer) and a schedule's actions where a schedule runs the step (a pipeline's). This callback
combines the records and knows no layout by name. The rank is blocked from the last overlapped
transfer's launch until backward returns (DDP waits there for every bucket); Lightning's
reductions for logging are wrapped and counted as blocking too. The training loss's mean over
ranks runs beside backward (runner/training/module.py) and is read after it: any wait left for it
(measured: under 0.04 ms) falls between backward and the optimizer, in idle.

Definitions (docs/measurement.md): compute = forward + backward + optimizer work; comm = time
blocked in a collective; idle = step wall - compute, so idle holds the exposed communication.
Every time is a stamp of runner/clock.py while the step runs: the host's clock on a CPU, a CUDA
event on a GPU (device time); the step's stamps become seconds after it, with one
synchronization on a GPU, none inside the step.
"""

from dataclasses import dataclass, field, replace
from statistics import fmean, median
from typing import Any

import pytorch_lightning as pl
import torch.distributed as dist

from runner import clock
from runner.clock import EventClock, HostClock
from runner.intervals import union_s
from runner.layouts.layout import layout_of
from runner.layouts.probes import Schedule, Span, Transfer, bus_bytes
from runner.mesh import P2P_DIMS, TRAFFIC_DIMS
from runner.metrics import (
    BUBBLE_MEASURED,
    COMM_ALGBW,
    COMM_BUSBW,
    COMM_BYTES_BY_COLLECTIVE,
    COMM_BYTES_PER_STEP,
    COMM_TIME,
    COMPUTE_TIME,
    HELD_FOR_BACKWARD,
    IDLE_FRACTION,
    IDLE_TIME,
    PEAK_ALLOCATED,
    PEAK_MEMORY,
    PEAKS,
    PROFILED,
    RANKED_TIMES,
    STEP_TIME,
    WORKSPACE,
    Metric,
    of_rank,
    worst,
)
from runner.training.callbacks.memory import PeakMemory
from runner.training.sampled_profile import SampledProfile

# A rank's own figures that are not logged as they are: combined into the run's (`combine`).
LOOP_TIME = "loop_time_s"  # the loop's interval: the run's throughput
BUBBLE = "bubble_fraction"  # what the schedule's window left idle: bubble_fraction_measured
# Each step's schedule window and the work in it, the window relative to the common origin: the
# run's bubble is over the pipeline's step, from the first rank's start to the last rank's end.
WINDOW = ("schedule_start_s", "schedule_end_s", "schedule_work_s")
WINDOWS = "schedule_windows"
SENT, BUS_BYTES, BUSY = "comm_bytes_{}", "comm_bus_bytes_{}", "comm_busy_s_{}"  # per dimension
SENT_BY_COLLECTIVE = "comm_bytes_dp/{}"  # sharded dp's payload of one collective


def collective(kind: str) -> str:
    """A metric's name for a transfer's kind: "dp all-gather" -> all_gather."""
    return kind.split()[-1].replace("-", "_")


def shares(wall: float, compute: float, comm: float) -> dict[str, float]:
    """A step's wall time split as docs/measurement.md defines it: idle = wall - compute."""
    return {
        STEP_TIME.name: wall,
        COMPUTE_TIME.name: compute,
        COMM_TIME.name: comm,
        IDLE_TIME.name: wall - compute,
        IDLE_FRACTION.name: (wall - compute) / wall,
    }


@dataclass
class Step:
    start: float = 0.0
    before_backward: float = 0.0
    after_backward: float = 0.0
    before_optimizer: float = 0.0
    end: float = 0.0
    next_start: float = 0.0  # when the next step began: the loop's full interval, for throughput
    validated: bool = False  # a validation ran between this step and the next
    transfers: list[Transfer] = field(default_factory=list)  # what the layouts' probes recorded
    schedule: Schedule | None = None  # a step a schedule ran as actions (a pipeline's)

    def overlapped(self) -> list[Transfer]:
        """Transfers waited for when the phase ends (DDP's buckets)."""
        return [t for t in self.transfers if not t.blocking and not t.apart]

    @property
    def last_launch(self) -> float:
        """The last overlapped transfer's launch: the rank is blocked from there until the phase
        that waits for them ends (DDP waits for every bucket before backward returns)."""
        return max((t.start for t in self.overlapped()), default=self.after_backward)

    def payloads(self) -> dict[str, float]:
        """Bytes this rank handed to collectives, per mesh dimension; for the collectives' bus
        bandwidth, their bytes as nccl-tests weights them and the time they were in flight."""
        out = dict.fromkeys((SENT.format(dim) for dim in TRAFFIC_DIMS), 0.0)
        for t in self.transfers:
            if t.dim:
                out[SENT.format(t.dim)] += t.nbytes
        if any(t.dim == "dp" and t.kind != "all-reduce" and t.nbytes for t in self.transfers):
            for t in self.transfers:  # sharded: named by collective, as the planner predicts them
                if t.dim == "dp" and t.nbytes:
                    key = SENT_BY_COLLECTIVE.format(collective(t.kind))
                    out[key] = out.get(key, 0.0) + t.nbytes
        for dim in TRAFFIC_DIMS[:-1]:  # not pp's: a pipeline's sends are p2p_bandwidth's
            mine = [t for t in self.transfers if t.dim == dim]
            if mine:
                out[BUS_BYTES.format(dim)] = sum(bus_bytes(t.kind, t.nbytes) for t in mine)
                out[BUSY.format(dim)] = union_s([(t.start, t.end) for t in mine])
        return out

    def figures(self) -> dict[str, float]:
        if self.schedule:
            return self.schedule_figures(self.schedule)
        wall = self.end - self.start
        exposed = self.after_backward - self.last_launch
        blocked = sum(t.seconds for t in self.transfers if t.blocking)
        phases = (
            (self.before_backward - self.start)
            + (self.last_launch - self.before_backward)
            + (self.end - self.before_optimizer)
        )
        return shares(wall, phases - blocked, exposed + blocked) | self.payloads()

    def schedule_figures(self, schedule: Schedule) -> dict[str, float]:
        """Compute = the schedule's compute actions and the optimizer, less the transfers that
        blocked inside them (in its window: tensor parallelism's; the exposed end of the data-
        parallel all-reduce that the last backward waits for); comm = those, P2P waits and the
        other collectives; the bubble = what the schedule's window leaves idle."""
        wall, (w0, w1) = self.end - self.start, schedule.window
        blocking = [t for t in self.transfers if t.blocking]
        inside = sum(t.seconds for t in blocking if w0 <= t.start and t.end <= w1)
        outside = sum(t.seconds for t in blocking if not (w0 <= t.start and t.end <= w1))
        overlapped = self.overlapped()
        if overlapped:
            inside += max(t.end for t in overlapped) - self.last_launch
        work = schedule.work_s() - inside
        others = outside + sum(t.seconds for t in schedule.transfers)
        compute = work + schedule.optimizer[1] - schedule.optimizer[0]
        return (
            shares(wall, compute, schedule.waits_s() + others + inside)
            | self.payloads()
            | {
                BUBBLE: 1 - work / (w1 - w0),
                **dict(zip(WINDOW, (w0, w1, work), strict=True)),
                SENT.format("pp"): float(schedule.sent_bytes),
            }
            | p2p_bandwidth(schedule)
        )

    def settled(self, seconds: Any) -> "Step":
        """The step with every stamp in seconds (those never set stay 0.0)."""
        return replace(
            self,
            **{k: seconds(getattr(self, k)) for k in ("start", "before_backward", "after_backward",
                                                       "before_optimizer", "end")},
            transfers=[t.settled(seconds) for t in self.transfers],
            schedule=self.schedule.settled(seconds) if self.schedule else None,
        )  # fmt: skip

    def spans(self, origin: float) -> list[Span]:
        """(kind, start, end, label) relative to origin, for the timeline pictures."""
        if self.schedule:
            phases = self.schedule.spans(origin)
            transfers = [*self.schedule.transfers, *self.transfers]
        else:
            phases = [
                ("forward", self.start - origin, self.before_backward - origin, ""),
                ("backward", self.before_backward - origin, self.last_launch - origin, ""),
                ("optimizer", self.before_optimizer - origin, self.end - origin, ""),
            ]
            transfers = self.transfers
        return phases + [(t.kind, t.start - origin, t.end - origin, "") for t in transfers]


class LoopTiming(pl.Callback):
    """The loop's intervals only (throughput) and the peak memory, every rank's gathered on rank 0
    at the end: all that is measured with `trainer.measure=false`, the baseline of what measuring
    costs."""

    def __init__(
        self, warmup_steps: int, timeline_steps: int = 3, cuda: bool = False, profile_every: int = 0
    ) -> None:
        self.warmup_steps = warmup_steps
        self.profile = SampledProfile(profile_every, cuda)  # trainer.profile_every_n_steps
        self.timeline_steps = timeline_steps
        self.cuda = cuda  # GPU work is asynchronous: time it with events on its streams
        self.steps: list[Step] = []
        self.origin = 0.0
        self.gathered: list[dict[str, Any]] = []  # every rank's summary on rank 0, after training
        self.memory = PeakMemory(cuda)

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        clock.use(EventClock() if self.cuda else HostClock())  # the device set: Lightning's setup
        self.origin = clock.seconds(clock.stamp())

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.memory.start(pl_module)  # weights in place, optimizer built, its state still to come

    @property
    def in_step(self) -> bool:
        return bool(self.steps) and not self.steps[-1].end

    def on_train_batch_start(self, trainer: pl.Trainer, *_: Any) -> None:
        index = len(self.steps)
        if index == 1:  # the first step has run every product once; outside the step's time
            self.memory.beyond_tensors(trainer.lightning_module, trainer.optimizers)
        if index >= self.warmup_steps and self.profile.wants(index):
            self.profile.start()
        self.steps.append(Step(start=clock.stamp()))
        self.memory.step_started()

    def on_train_batch_end(self, trainer: pl.Trainer, *_: Any) -> None:
        step = self.steps[-1]
        step.end = clock.stamp()
        self.attach(trainer, step)
        clock.settle()  # the step's one synchronization (on a GPU; nothing to wait for on a CPU)
        self.steps[-1] = step = step.settled(clock.seconds)
        self.profile.stop()  # after the settling: on a GPU the step's kernels have all run
        if len(self.steps) > 1:  # the previous step's loop interval ends where this one began
            self.steps[-2].next_start = step.start

    def attach(self, trainer: pl.Trainer, step: "Step") -> None:
        """What a subclass adds to the step before its stamps are read."""

    def on_validation_start(self, *_: Any) -> None:
        if self.steps:
            self.steps[-1].validated = True  # its loop interval holds a validation: not training

    def looped(self) -> list[Step]:
        """The steps after warm-up whose loop interval is known (not the last one, none holding a
        validation): every figure is over these, so no step's wall outweighs the intervals."""
        timed = self.steps[self.warmup_steps :]
        return [s for s in timed if s.next_start and not s.validated] or timed

    def rank_summary(self) -> dict[str, Any]:
        loops = [s.next_start - s.start for s in self.looped() if s.next_start]
        figures = {LOOP_TIME: fmean(loops)} if loops else {}
        for figure, peak in ((PEAK_MEMORY, self.memory.peak_gib()),
                             (PEAK_ALLOCATED, self.memory.peak_allocated_gib()),
                             (HELD_FOR_BACKWARD, self.memory.held_gib()),
                             (WORKSPACE, self.memory.workspace_gib())):  # fmt: skip
            if peak is not None:
                figures[figure.name] = peak
        figures |= self.profile.summary()
        return {"figures": figures, "spans": [], "trace": self.profile.trace}

    def on_train_end(self, *_: Any) -> None:
        """Every rank's summary to rank 0: one object gather, once, after training."""
        mine = self.rank_summary()
        if not (dist.is_available() and dist.is_initialized()):
            self.gathered = [mine]
            return
        everyone: list[Any] | None = (
            [None] * dist.get_world_size() if dist.get_rank() == 0 else None
        )
        dist.gather_object(mine, everyone, dst=0)
        self.gathered = everyone or []


class RankTiming(LoopTiming):
    """Times every step on every rank: forward, backward, optimizer, every collective."""

    # --- what runs ---
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Each layout's strategy installs its own probes (runner/layouts/<layout>/probe.py): what
        # they record comes back as typed records. One device has no layout and nothing to probe.
        layout_of(trainer.strategy).install_probes(self._record)
        if dist.is_available() and dist.is_initialized():
            self._wrap_reduce(trainer.strategy)
            dist.barrier()  # a common origin for every rank's clock
        super().on_fit_start(trainer, pl_module)

    def _record(self, transfer: Transfer) -> None:
        if self.in_step:  # validation's forward runs collectives too: not part of a step
            self.steps[-1].transfers.append(transfer)
            if transfer.dim == "dp":  # gradients made, FSDP's weights gathered or freed
                self.memory.sample()

    def _wrap_reduce(self, strategy: Any) -> None:
        """Time Lightning's reductions for logging, inside a step (validation's are not)."""
        reduce = strategy.reduce

        def timed_reduce(*args: Any, **kwargs: Any) -> Any:
            start = clock.stamp()
            out = reduce(*args, **kwargs)
            self._record(Transfer("", "all-reduce", start, clock.stamp()))
            return out

        strategy.reduce = timed_reduce

    # --- the step's boundaries ---
    def on_before_backward(self, *_: Any) -> None:
        self.steps[-1].before_backward = clock.stamp()
        self.memory.sample()  # forward's activations all held

    def on_before_zero_grad(self, *_: Any) -> None:
        # Forward is done and the last step's gradients are still held, as at the step's start:
        # Lightning frees them next, before backward
        self.memory.forward_ended()

    def on_after_backward(self, *_: Any) -> None:
        self.steps[-1].after_backward = clock.stamp()
        self.memory.sample()

    def on_before_optimizer_step(self, *_: Any) -> None:
        self.steps[-1].before_optimizer = clock.stamp()

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        self.memory.sample()  # the optimizer's state made, its step's temporaries
        super().on_train_batch_end(trainer, *args)

    def attach(self, trainer: pl.Trainer, step: "Step") -> None:
        # A strategy that runs its steps as a schedule (the pipeline's) hands over its record.
        step.schedule = layout_of(trainer.strategy).last_schedule()

    # --- the record ---
    def rank_summary(self) -> dict[str, Any]:
        summary = super().rank_summary()
        per_step = [s.figures() for s in self.looped()]
        windows = [tuple(f.pop(k) for k in WINDOW) for f in per_step if WINDOW[0] in f]
        if windows:  # on the common origin, comparable between ranks
            summary["figures"][WINDOWS] = [(a - self.origin, b - self.origin, w)
                                           for a, b, w in windows]  # fmt: skip
        if per_step:
            # A step without some collective moved none of its bytes (FSDP's weights may still be
            # gathered from the step before): zero for it, not missing.
            keys = {k: None for f in per_step for k in f}
            summary["figures"] |= {k: fmean(f.get(k, 0.0) for f in per_step) for k in keys}
        shown = self.steps[self.warmup_steps :][: self.timeline_steps]
        return summary | {"spans": [s.spans(self.origin) for s in shown]}


def p2p_bandwidth(schedule: Schedule) -> dict[str, float]:
    """What the bandwidth of the step's P2P sends is computed from: their bytes, and the time at
    least one was between its launch and the end of the wait for it."""
    if not schedule.sends:
        return {}
    return {
        BUS_BYTES.format("pp"): float(sum(t.nbytes for t in schedule.sends)),
        BUSY.format("pp"): union_s([(t.start, t.end) for t in schedule.sends]),
    }


def bandwidths(per_rank: list[dict[str, float]], sizes: dict[str, int]) -> dict[str, float]:
    """Per mesh dimension, what its transfers delivered (means over ranks, GB/s): algbw, the
    payload over the time a transfer was in flight; busbw, nccl-tests' bus bandwidth."""
    out = {}
    for dim in TRAFFIC_DIMS:
        timed = [r for r in per_rank if r.get(BUSY.format(dim))]
        if not timed or sizes.get(dim, 1) < 2:
            continue
        busy = [r[BUSY.format(dim)] for r in timed]
        n = sizes[dim]
        scale = 1.0 if dim in P2P_DIMS else (n - 1) / n  # a P2P send carries its payload once
        alg = [r[SENT.format(dim)] / s for r, s in zip(timed, busy, strict=True)]
        bus = [r[BUS_BYTES.format(dim)] * scale / s for r, s in zip(timed, busy, strict=True)]
        out[COMM_ALGBW.at(dim=dim)] = fmean(alg) / 1e9
        out[COMM_BUSBW.at(dim=dim)] = fmean(bus) / 1e9
    return out


def combine(
    per_rank: list[dict[str, float]], dims: dict[str, int] | None = None
) -> dict[str, float]:
    """The run's figures: means over ranks, the worst idle fraction, each rank's own; `dims`:
    the mesh's dimensions' sizes, for the bandwidth the collectives delivered."""
    if not per_rank or not per_rank[0]:
        return {}
    out = {LOOP_TIME: fmean(r[LOOP_TIME] for r in per_rank)} if LOOP_TIME in per_rank[0] else {}
    for figure in PROFILED:  # the sampled profiler traces' breakdown
        if figure.name in per_rank[0]:
            out[figure.name] = fmean(r[figure.name] for r in per_rank)
            out[worst(figure)] = max(r[figure.name] for r in per_rank)
            out |= each_rank(per_rank, figure)
    for figure in PEAKS:
        if figure.name in per_rank[0]:  # the busiest rank's: what must fit on every device
            out[figure.name] = max(r[figure.name] for r in per_rank)
            out |= each_rank(per_rank, figure)
    if STEP_TIME.name not in per_rank[0]:  # trainer.measure=false: the loop's intervals only
        return out
    means = (STEP_TIME, COMPUTE_TIME, COMM_TIME, IDLE_TIME, IDLE_FRACTION)
    out |= {f.name: fmean(r[f.name] for r in per_rank) for f in means}
    out[worst(IDLE_FRACTION)] = max(r[IDLE_FRACTION.name] for r in per_rank)
    # Payloads per rank; the mean over ranks where they differ (pipeline stages do, and dropless
    # experts' ranks: a combine returns what its experts were sent).
    for dim in TRAFFIC_DIMS:
        sizes = [r.get(SENT.format(dim), 0.0) for r in per_rank]
        if any(sizes):
            out[COMM_BYTES_PER_STEP.at(dim=dim)] = fmean(sizes)
    named = sorted({k for r in per_rank for k in r if k.startswith(SENT_BY_COLLECTIVE.format(""))})
    for key in named:
        out[COMM_BYTES_BY_COLLECTIVE.at(collective=key.split("/")[1])] = fmean(
            r.get(key, 0.0) for r in per_rank
        )
    out |= bandwidths(per_rank, dims or {})
    if BUBBLE in per_rank[0]:
        out[BUBBLE_MEASURED.name] = pipeline_bubble(per_rank)
    for figure in RANKED_TIMES:
        out |= each_rank(per_rank, figure)
    return out


def pipeline_bubble(per_rank: list[dict[str, Any]]) -> float:
    """The share of the pipeline's step its ranks sat idle, as the schedule's theory counts it:
    each step from the first rank's schedule start to the last rank's end, every rank's work
    against that. A rank's own window misses the drain: the last stage finishes first and waits
    for the others' backward in the collectives after it (the loss's broadcast), outside its
    window. The median step's: a step another process's burst of load stalled a stage in is the
    host's, not the schedule's (beside another test's job, the mean of four steps read 1F1B's
    bubble at m = 8 as 23 % once, against the theory's 11). Without every rank's windows: the
    mean of each rank's own."""
    windows = [r.get(WINDOWS) for r in per_rank]
    steps = {len(w) for w in windows if w}
    if not all(windows) or len(steps) != 1:
        return fmean(r[BUBBLE] for r in per_rank)
    idle = []
    for step in zip(*windows, strict=True):
        span = max(end for _, end, _ in step) - min(start for start, _, _ in step)
        idle.append(fmean(1 - work / span for _, _, work in step))
    return median(idle)


def each_rank(per_rank: list[dict[str, float]], figure: Metric) -> dict[str, float]:
    """Every rank's own value of a figure, by its per-rank name."""
    return {of_rank(figure, i): r[figure.name] for i, r in enumerate(per_rank)}
