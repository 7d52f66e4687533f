"""Where each rank's step time goes: compute, blocked in communication, idle; and bytes sent.

Timed from what really runs. Lightning's hooks bound forward, backward and optimizer work; under
DDP a communication hook wraps the gradient all-reduce of every bucket, counting its payload and
stamping when the bucket was ready and when its all-reduce finished. The rank is blocked on
communication from the last bucket's launch until backward returns (DDP waits there for every
all-reduce); Lightning's synchronizations for logging (validation's loss, a pipeline's) are wrapped
and counted as blocked too. The training loss's mean over ranks runs beside backward
(runner/training/module.py) and is read after it: any wait left for it (measured: under 0.04 ms)
falls between backward and the optimizer, in idle.
Tensor parallelism's collectives run inside forward and backward: each is timed and counted
(runner/layouts/tensor/probe.py) and its time moves from compute to comm.

Definitions (docs/measurement.md): compute = forward + backward + optimizer work; comm = time
blocked in a collective; idle = step wall - compute, so idle holds the exposed communication.
"""

import time
from dataclasses import dataclass, field
from statistics import fmean
from typing import Any

import pytorch_lightning as pl
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

from runner.layouts.tensor import probe as tensor_collectives


def shares(wall: float, compute: float, comm: float) -> dict[str, float]:
    """A step's wall time split as docs/measurement.md defines it: idle = wall - compute."""
    return {
        "step_time_s": wall,
        "compute_time_s": compute,
        "comm_time_s": comm,
        "idle_time_s": wall - compute,
        "idle_fraction": (wall - compute) / wall,
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
    pipeline: dict[str, Any] | None = None  # a pipeline step's schedule actions (strategy's record)
    syncs: list[tuple[float, float]] = field(default_factory=list)  # other blocking collectives
    buckets: list[tuple[float, float, int]] = field(default_factory=list)  # ready, done, bytes
    tensor: list[tuple[str, float, float, int]] = field(default_factory=list)  # kind, start, end, B

    @property
    def last_ready(self) -> float:
        return max((ready for ready, _, _ in self.buckets), default=self.after_backward)

    def communication(self) -> dict[str, float]:
        """Payloads per mesh dimension, and the time tensor parallelism's collectives blocked."""
        return {
            "comm_bytes_dp": float(sum(size for _, _, size in self.buckets)),
            "comm_bytes_tp": float(sum(size for *_, size in self.tensor)),
            "tp_time": sum(end - start for _, start, end, _ in self.tensor),
        }

    def figures(self) -> dict[str, float]:
        if self.pipeline:
            return self.pipeline_figures()
        wall = self.end - self.start
        grad_wait = self.after_backward - self.last_ready
        sync = sum(end - start for start, end in self.syncs)
        forward = self.before_backward - self.start - sync
        compute = (
            forward + (self.last_ready - self.before_backward) + (self.end - self.before_optimizer)
        )
        comm = self.communication()
        tp_time = comm.pop("tp_time")
        return shares(wall, compute - tp_time, grad_wait + sync + tp_time) | comm

    def pipeline_figures(self) -> dict[str, float]:
        """Compute = the schedule's forward/backward/weight actions and the optimizer, less the
        collectives inside them (tensor parallelism's; the data-parallel all-reduce the last
        backward waits for); comm = those, P2P waits and other collectives; the bubble = what the
        schedule's window leaves idle."""
        p, wall = self.pipeline, self.end - self.start
        comm = self.communication()
        inside = comm.pop("tp_time") + self.grad_wait()
        work = sum(end - start for kind, start, end, _ in p["actions"] if kind != "wait") - inside
        waits = sum(end - start for kind, start, end, _ in p["actions"] if kind == "wait")
        syncs = sum(end - start for start, end in [*p["syncs"], *self.syncs])
        compute = work + p["optimizer"][1] - p["optimizer"][0]
        window = p["window"][1] - p["window"][0]
        return (
            shares(wall, compute, waits + syncs + inside)
            | comm
            | {
                "bubble_fraction": 1 - work / window,
                "comm_bytes_pp": float(p["sent_bytes"]),
            }
        )

    def grad_wait(self) -> float:
        """How long the last bucket's all-reduce outlasted its launch: the exposed part."""
        if not self.buckets:
            return 0.0
        return max(done for _, done, _ in self.buckets) - self.last_ready

    def spans(self, origin: float) -> list[tuple[str, float, float, str]]:
        """(kind, start, end, label) relative to origin, for the timeline pictures."""
        if self.pipeline:
            return self.pipeline_spans(origin)
        spans = [
            ("forward", self.start, self.before_backward),
            ("backward", self.before_backward, self.last_ready),
            ("optimizer", self.before_optimizer, self.end),
        ]
        spans += [("all-reduce", ready, done) for ready, done, _ in self.buckets]
        spans += [("all-reduce", start, end) for start, end in self.syncs]
        spans += [(kind, start, end) for kind, start, end, _ in self.tensor]
        return [(kind, a - origin, b - origin, "") for kind, a, b in spans]

    def pipeline_spans(self, origin: float) -> list[tuple[str, float, float, str]]:
        names = {"F": "forward", "B": "backward", "W": "weight", "w": "p2p wait"}
        p = self.pipeline
        spans = [
            (names[kind[0]], start - origin, end - origin, "" if mb < 0 else str(mb))
            for kind, start, end, mb in p["actions"]
        ]
        spans.append(("optimizer", p["optimizer"][0] - origin, p["optimizer"][1] - origin, ""))
        comm = [("all-reduce", a, b) for a, b in [*p["syncs"], *self.syncs]]
        comm += [("all-reduce", ready, done) for ready, done, _ in self.buckets]
        comm += [(kind, a, b) for kind, a, b, _ in self.tensor]
        return spans + [(kind, a - origin, b - origin, "") for kind, a, b in comm]


class LoopTiming(pl.Callback):
    """The loop's intervals only (throughput), every rank's gathered on rank 0 at the end: all
    that is measured with `trainer.measure=false`, the baseline of what measuring costs."""

    def __init__(self, warmup_steps: int, timeline_steps: int = 3, cuda: bool = False) -> None:
        self.warmup_steps = warmup_steps
        self.timeline_steps = timeline_steps
        self.cuda = cuda  # GPU work is asynchronous: wait for it at every boundary
        self.steps: list[Step] = []
        self.origin = 0.0
        self.gathered: list[dict[str, Any]] = []  # every rank's summary on rank 0, after training

    def now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    @property
    def in_step(self) -> bool:
        return bool(self.steps) and not self.steps[-1].end

    def on_train_batch_start(self, *_: Any) -> None:
        start = self.now()
        if self.steps:
            self.steps[-1].next_start = start
        self.steps.append(Step(start=start))

    def on_train_batch_end(self, trainer: pl.Trainer, *_: Any) -> None:
        self.steps[-1].end = self.now()

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
        return {"figures": {"loop_time_s": fmean(loops)} if loops else {}, "spans": []}

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
        # DDP wraps the whole module (data parallelism) or parts of it (the mesh strategies'
        # replicas): hook each, over its own process group (the dp dimension of a mesh).
        for model in [trainer.strategy.model, *getattr(trainer.strategy, "replicas", [])]:
            if isinstance(model, DistributedDataParallel):
                model.register_comm_hook(model.process_group, self._counting_allreduce)
        if dist.is_available() and dist.is_initialized():
            self._wrap_reduce(trainer.strategy)
            tensor_collectives.install(self._record_tensor)
            dist.barrier()  # a common origin for every rank's clock
        self.origin = self.now()

    def _record_tensor(self, kind: str, start: float, end: float, size: int) -> None:
        if self.in_step:  # validation's forward runs collectives too: not part of a step
            self.steps[-1].tensor.append((kind, start, end, size))

    def _counting_allreduce(
        self, state: Any, bucket: dist.GradBucket
    ) -> torch.futures.Future[torch.Tensor]:
        step, ready = self.steps[-1], time.perf_counter()
        size = bucket.buffer().numel() * bucket.buffer().element_size()

        def done(fut: torch.futures.Future) -> torch.Tensor:
            step.buckets.append((ready, time.perf_counter(), size))
            return fut.value()

        return allreduce_hook(state, bucket).then(done)

    def _wrap_reduce(self, strategy: Any) -> None:
        """Time Lightning's reductions for logging, inside a step (validation's are not)."""
        reduce = strategy.reduce

        def timed_reduce(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            out = reduce(*args, **kwargs)
            if self.in_step:
                self.steps[-1].syncs.append((start, time.perf_counter()))
            return out

        strategy.reduce = timed_reduce

    # --- the step's boundaries ---
    def on_before_backward(self, *_: Any) -> None:
        self.steps[-1].before_backward = self.now()

    def on_after_backward(self, *_: Any) -> None:
        self.steps[-1].after_backward = self.now()

    def on_before_optimizer_step(self, *_: Any) -> None:
        self.steps[-1].before_optimizer = self.now()

    def on_train_batch_end(self, trainer: pl.Trainer, *_: Any) -> None:
        super().on_train_batch_end(trainer)
        self.steps[-1].pipeline = getattr(trainer.strategy, "step_record", None)

    # --- the record ---
    def rank_summary(self) -> dict[str, Any]:
        summary = super().rank_summary()
        per_step = [s.figures() for s in self.looped()]
        if per_step:
            summary["figures"] |= {k: fmean(f[k] for f in per_step) for k in per_step[0]}
        shown = self.steps[self.warmup_steps :][: self.timeline_steps]
        return summary | {"spans": [s.spans(self.origin) for s in shown]}


def combine(per_rank: list[dict[str, float]]) -> dict[str, float]:
    """The run's figures: means over ranks, the worst idle fraction, and each rank's own."""
    if not per_rank or not per_rank[0]:
        return {}
    out = (
        {"loop_time_s": fmean(r["loop_time_s"] for r in per_rank)}
        if "loop_time_s" in per_rank[0]
        else {}
    )
    if "step_time_s" not in per_rank[0]:  # trainer.measure=false: the loop's intervals only
        return out
    means = ("step_time_s", "compute_time_s", "comm_time_s", "idle_time_s")
    out |= {k: fmean(r[k] for r in per_rank) for k in means}
    out["idle_fraction"] = fmean(r["idle_fraction"] for r in per_rank)
    out["idle_fraction_max"] = max(r["idle_fraction"] for r in per_rank)
    # Payloads per rank; the mean over ranks where they differ (pipeline stages do).
    for dim in ("dp", "tp", "pp"):
        sizes = [r.get(f"comm_bytes_{dim}", 0.0) for r in per_rank]
        if any(sizes):
            out[f"comm_bytes_per_step/{dim}"] = fmean(sizes)
    if "bubble_fraction" in per_rank[0]:
        out["bubble_fraction_measured"] = fmean(r["bubble_fraction"] for r in per_rank)
    for rank, r in enumerate(per_rank):
        for key in ("compute_time_s", "comm_time_s", "idle_fraction"):
            out[f"rank_{rank}/{key}"] = r[key]
    return out
