"""The planner: a job's traffic, time, memory, energy and cost from formulas and a hardware
profile, without running it. Training runs log its predictions as `pred/...` beside what they
measure; `mode=plan` prints them for jobs too large to run (runner/modes/plan.py).
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from runner.layouts import traffic
from runner.layouts.pipeline.traffic import pipeline_bubble
from runner.layouts.traffic import FP32_BYTES, ring_allreduce_bytes
from runner.mesh import mesh_of
from runner.models.registry import spec_for
from runner.planner.failures import energy_kwh, snapshot_plan
from runner.planner.hardware import device_share
from runner.planner.memory import DTYPE_BYTES, memory_per_device_gib
from runner.planner.timing import model_flops_per_step, step_time, tokens_per_sample

__all__ = ["plan", "predict", "ring_allreduce_bytes"]


def predict(cfg: DictConfig, world: int) -> dict[str, float]:
    """`pred/...` for every figure a training run measures (fp32, as the runner trains); none
    for a model the registry does not know."""
    if spec_for(cfg.model) is None:
        return {}
    mesh, moved = mesh_of(cfg), traffic(cfg, FP32_BYTES)
    time = step_time(cfg, moved)
    out = {"pred/step_time_s": time.total_s}
    if world < 2:
        return out
    out["pred/idle_fraction"] = time.idle_fraction
    for dim, payload in moved.payload.items():
        out[f"pred/comm_bytes_per_step/{dim}"] = payload
    if "dp" in moved.payload:
        out["pred/ring_bytes_per_step/dp"] = ring_allreduce_bytes(moved.payload["dp"], mesh.dp)
    if mesh.pp > 1:
        out["bubble_fraction_theory"] = pipeline_bubble(cfg, mesh)
    return out


def plan(cfg: DictConfig) -> dict[str, Any]:
    """Everything mode=plan reports for one job (the model's sizes come from runner/plan.py)."""
    mesh, dtype = mesh_of(cfg), cfg.plan.dtype
    moved = traffic(cfg, DTYPE_BYTES[dtype])
    time = step_time(cfg, moved, dtype)
    samples_per_s = cfg.data.batch_size / time.total_s
    tokens_per_s = samples_per_s * tokens_per_sample(cfg)
    hours = duration_hours(cfg, tokens_per_s, time.total_s)
    energy = energy_kwh(cfg, mesh.world, hours * 3600)
    peak = cfg.hardware.peak_tflops[dtype] * 1e12 / device_share(cfg.hardware)
    return {
        "world_size": mesh.world,
        "mem_per_device_gib": memory_per_device_gib(cfg, dtype),
        "comm_bytes_per_step": {d: moved.payload.get(d, 0.0) for d in ("dp", "tp", "pp")},
        "comm_time_s": {d: time.comm_s.get(d, 0.0) for d in ("dp", "tp", "pp")},
        "bubble_fraction": pipeline_bubble(cfg, mesh),
        "step_time_s": time.total_s,
        "idle_fraction": time.idle_fraction,
        "tokens_per_s": tokens_per_s,
        "mfu": model_flops_per_step(cfg) / time.total_s / (mesh.world * peak),
        "hours": hours,
        "energy_kwh": energy,
        "cost_usd": energy * cfg.hardware.usd_per_kwh,
        "snapshots": snapshot_plan(cfg, mesh.world, energy * cfg.hardware.usd_per_kwh),
    }


def duration_hours(cfg: DictConfig, tokens_per_s: float, step_s: float) -> float:
    """plan.hours, or the time to train on plan.tokens, or trainer.max_steps steps."""
    if cfg.plan.hours is not None:
        return cfg.plan.hours
    if cfg.plan.tokens is not None:
        return cfg.plan.tokens / tokens_per_s / 3600
    return cfg.trainer.max_steps * step_s / 3600
