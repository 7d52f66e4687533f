"""The planner: a job's traffic, time, memory, energy and cost from formulas and a hardware
profile, without running it. Training runs log its predictions as `pred/...` beside what they
measure; `mode=plan` prints them for jobs too large to run (runner/modes/plan.py).
"""

from __future__ import annotations

from typing import Any

from runner.config import PlanConfig
from runner.job import Job
from runner.layouts import traffic
from runner.layouts.pipeline.traffic import pipeline_bubble
from runner.layouts.traffic import ring_allreduce_bytes
from runner.mesh import TRAFFIC_DIMS, WHERE_USED
from runner.metrics import (
    BUBBLE_THEORY,
    COMM_BUSBW,
    COMM_BYTES_BY_COLLECTIVE,
    COMM_BYTES_PER_STEP,
    HELD_FOR_BACKWARD,
    IDLE_FRACTION,
    MFU,
    PEAK_MEMORY,
    PLAN_BUBBLE,
    PLAN_COMM_BYTES_BY_COLLECTIVE,
    PLAN_COMM_BYTES_PER_STEP,
    PLAN_COMM_HIDDEN,
    PLAN_COMM_TIME,
    PLAN_COST,
    PLAN_ENERGY,
    PLAN_HOURS,
    PLAN_IDLE_FRACTION,
    PLAN_MEMORY,
    PLAN_MFU,
    PLAN_MTBF,
    PLAN_STEP_TIME,
    PLAN_TIME_BY_PART,
    PLAN_TOKENS_PER_S,
    PLAN_WORLD_SIZE,
    PRED_RING_BYTES,
    STEP_TIME,
    WORKSPACE,
    prediction,
)
from runner.planner.failures import energy_kwh, snapshot_plan
from runner.planner.hardware import device_share, tier
from runner.planner.memory import memory_per_device_gib
from runner.planner.scatter_gather import scatter_gather
from runner.planner.timing import dp_wire_bytes, model_flops_per_step, step_time
from runner.precision import precision_of

__all__ = ["mfu", "plan", "predict", "ring_allreduce_bytes"]


def mfu(job: Job, step_time_s: float) -> float:
    """Model FLOPs utilization: the model's FLOPs in a step (6 per parameter and token, attention
    besides: no recomputation, no padding counted) over what the job's devices could do in that
    time at the run's precision (runner/precision.py)."""
    hw, compute = job.hardware, precision_of(job.trainer).compute
    peak = hw.peak_tflops[compute] * 1e12 / device_share(hw)
    return model_flops_per_step(job) / step_time_s / (job.mesh.world * peak)


def predict(job: Job) -> dict[str, float]:
    """`pred/...` for every figure a training run measures, at the run's precision."""
    mesh, moved = job.mesh, traffic(job)
    time, memory = step_time(job, moved), memory_per_device_gib(job)
    out = {
        prediction(STEP_TIME.name): time.total_s,
        prediction(MFU.name): mfu(job, time.total_s),
        prediction(PEAK_MEMORY.name): memory["total"],
        prediction(HELD_FOR_BACKWARD.name): memory["activations"],
        prediction(WORKSPACE.name): memory["workspace"],
    }
    if mesh.world < 2:
        return out
    out[prediction(IDLE_FRACTION.name)] = time.idle_fraction
    for dim, payload in moved.payload.items():
        out[prediction(COMM_BYTES_PER_STEP.at(dim=dim))] = payload
        link = tier(job.hardware, mesh, dim)  # what a transfer reaches on it: its bus bandwidth
        out[prediction(COMM_BUSBW.at(dim=dim))] = link.bandwidth_gbs * link.efficiency
    for key, payload in moved.by_collective.items():  # sharded dp: "dp/all_gather" and the like
        collective = key.split("/")[1]
        out[prediction(COMM_BYTES_BY_COLLECTIVE.at(collective=collective))] = payload
    if "dp" in moved.payload:  # a ring's bytes on each rank's link, each collective as it runs
        out[PRED_RING_BYTES.name] = dp_wire_bytes(job, moved)
    if mesh.pp > 1:
        out[BUBBLE_THEORY.name] = pipeline_bubble(job)
    return out


def plan(job: Job) -> dict[str, Any]:
    """Everything mode=plan reports for one job (the model's sizes: runner/modes/plan.py)."""
    mesh, settings, hw = job.mesh, job.plan, job.hardware
    moved = scatter_gather(job, traffic(job)) if settings.scatter_gather else traffic(job)
    time = step_time(job, moved)
    tokens_per_s = job.batch_size / time.total_s * job.tokens_per_sample
    hours = duration_hours(settings, tokens_per_s, job.trainer.max_steps * time.total_s)
    energy = energy_kwh(hw, mesh.world, hours * 3600)
    # The mesh's dimensions, and sequence parallelism's where it runs
    dims = [d for d in TRAFFIC_DIMS if d not in WHERE_USED or d in moved.payload]
    # Nested figures are logged flattened: {"comm_time_s": {"dp": ...}} as comm_time_s/dp.
    return {
        PLAN_WORLD_SIZE.name: mesh.world,
        PLAN_MEMORY.group: memory_per_device_gib(job),
        PLAN_COMM_BYTES_PER_STEP.group: {d: moved.payload.get(d, 0.0) for d in dims},
        PLAN_COMM_BYTES_BY_COLLECTIVE.group: dict(moved.by_collective),  # sharded dp's
        PLAN_COMM_TIME.group: {d: time.comm_s.get(d, 0.0) for d in dims},
        PLAN_COMM_HIDDEN.group: {d: time.hidden_s.get(d, 0.0) for d in dims},
        PLAN_TIME_BY_PART.group: time.parts,
        "bound": time.bound,  # words: printed and tagged, not logged as a metric
        PLAN_BUBBLE.name: pipeline_bubble(job),
        PLAN_STEP_TIME.name: time.total_s,
        PLAN_IDLE_FRACTION.name: time.idle_fraction,
        PLAN_TOKENS_PER_S.name: tokens_per_s,
        PLAN_MFU.name: mfu(job, time.total_s),
        PLAN_HOURS.name: hours,
        PLAN_ENERGY.name: energy,
        PLAN_COST.name: energy * hw.usd_per_kwh,
        PLAN_MTBF.group: snapshot_plan(settings, mesh.world, energy * hw.usd_per_kwh),
    }


def duration_hours(settings: PlanConfig, tokens_per_s: float, steps_s: float) -> float:
    """plan.hours, or the time to train on plan.tokens, or trainer.max_steps steps (steps_s)."""
    if settings.hours is not None:
        return settings.hours
    if settings.tokens is not None:
        return settings.tokens / tokens_per_s / 3600
    return steps_s / 3600
