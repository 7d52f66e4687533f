"""A layout's price: the planner's memory per device, and for a layout that fits, its step time,
MFU, bubble and what bounds it, with the training's hours and cost.

Layouts share most of their work: the same stage, micro-batch and tensor split in many meshes,
schedules and sharding levels. The planner's per-stage figures are kept in one memo across the
search (runner/memo.py: the base job's memo, which every layout's job shares), so each layout
pays for what is its own.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from runner.job import Job
from runner.layouts import traffic
from runner.layouts.pipeline.traffic import pipeline_bubble
from runner.memo import shared
from runner.models.sizes import stage_layers
from runner.planner import duration_hours, mfu
from runner.planner.failures import energy_kwh
from runner.planner.memory import memory_per_device_gib
from runner.planner.scatter_gather import scatter_gather
from runner.planner.timing import step_time
from runner.search.space import Layout


@dataclass(frozen=True)
class Priced:
    layout: Layout
    memory_gib: float
    fits: bool
    step_time_s: float = float("nan")
    mfu: float = float("nan")
    bubble: float = float("nan")
    bound: str = "memory"
    hours: float = float("nan")
    cost_usd: float = float("nan")
    parts: dict[str, float] = field(default_factory=dict)  # the step's time by what spends it


def job_of(base: Job, layout: Layout) -> Job:
    """The base job in this layout. Its settings' pieces are shared by the layouts that differ
    in nothing else (in `base.memo`, which a search's jobs share): a search makes thousands."""
    parallel = piece(base, base.parallel, tuple(layout.parallel.items()))
    trainer = piece(base, base.trainer, (("recompute", layout.recompute),))
    hardware = piece(base, base.hardware, (("nodes", layout.nodes),))
    return dataclasses.replace(
        base, mesh=layout.mesh, parallel=parallel, trainer=trainer, hardware=hardware,
        stages=stages_of(base, layout.pp, layout.virtual_stages),
    )  # fmt: skip


@shared(key=lambda base, pp, virtual: (pp, virtual))
def stages_of(base: Job, pp: int, virtual: int) -> list[range]:
    """A layout's pipeline stages: its pp and virtual stages decide them."""
    return stage_layers(base.model, {"pp": pp, "virtual_stages": virtual, "split": None})


@shared(key=lambda base, settings, changed: (type(settings).__name__, changed))
def piece(base: Job, settings: Any, changed: tuple[tuple[str, Any], ...]) -> Any:
    """`settings` with `changed`, made once per search."""
    return dataclasses.replace(settings, **dict(changed))


def price(base: Job, layout: Layout, device_gib: float) -> Priced:
    """The layout's memory; for one that fits in `device_gib`, its time and price too."""
    job = job_of(base, layout)
    memory = memory_per_device_gib(job)["total"]
    if memory > device_gib:
        return Priced(layout, memory, False)
    moved = scatter_gather(job, traffic(job)) if job.plan.scatter_gather else traffic(job)
    time = step_time(job, moved)
    step = time.total_s
    tokens_per_s = job.batch_size / step * job.tokens_per_sample
    hours = duration_hours(job.plan, tokens_per_s, job.trainer.max_steps * step)
    energy = energy_kwh(job.hardware, job.mesh.world, hours * 3600)
    return Priced(
        layout, memory, True, step, mfu(job, step), pipeline_bubble(job), time.bound, hours,
        energy * job.hardware.usd_per_kwh, time.parts,
    )  # fmt: skip
