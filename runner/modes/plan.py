"""mode=plan: a job's size, memory, traffic, time, energy and cost, without training it.

The runner's models are counted from their configs by their specs (runner/models/): nothing is
built, so GPT-3 on a thousand GPUs plans in seconds. The figures come from the planner
(runner/planner/) and the hardware profile; they are printed as a table, logged as an MLflow run
(tag mode=plan), and with plan.json=true printed as one JSON object on the last line of standard
output.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig

from runner.job import Job
from runner.mesh import TRAFFIC_DIMS, WHERE_USED
from runner.metrics import (
    PLAN_BUBBLE,
    PLAN_COMM_BYTES_BY_COLLECTIVE,
    PLAN_COMM_BYTES_PER_STEP,
    PLAN_COST,
    PLAN_DEVICE_MEMORY,
    PLAN_ENERGY,
    PLAN_FITS,
    PLAN_HOURS,
    PLAN_IDLE_FRACTION,
    PLAN_LOST_COST,
    PLAN_MEMORY,
    PLAN_MFU,
    PLAN_MTBF,
    PLAN_PARAMS,
    PLAN_PARAMS_BY_COMPONENT,
    PLAN_SNAPSHOT_INTERVAL,
    PLAN_STEP_TIME,
    PLAN_TIME_BY_PART,
    PLAN_TOKENS_PER_S,
    PLAN_WASTE,
    PLAN_WORLD_SIZE,
)
from runner.planner import plan
from runner.planner.memory import largest_layer_gib
from runner.units import size
from runner.validate import host_memory_gib


def model_sizes(job: Job) -> dict[str, Any]:
    """Parameters in all and by component, from the model's spec (the tests check each spec's
    formulas against the module built, GPT-3 on the meta device)."""
    by_component = job.spec.params_by_component(job.model)
    return {
        PLAN_PARAMS.name: sum(by_component.values()),
        PLAN_PARAMS_BY_COMPONENT.group: by_component,
    }


def figures(cfg: DictConfig, job: Job) -> dict[str, Any]:
    out = model_sizes(job) | plan(job)
    memory = job.hardware.memory_gib or host_memory_gib()
    need = out[PLAN_MEMORY.group]["total"]
    out[PLAN_DEVICE_MEMORY.name] = memory
    out[PLAN_FITS.name] = need <= memory
    if not out[PLAN_FITS.name]:  # the step cannot run at all: memory bounds it before time does
        out["bound"] = "memory"
        out["to_fit"] = to_fit(job, need, memory)
    return out


def to_fit(job: Job, need: float, have: float) -> str:
    """What a layout that does not fit would need."""
    layer = largest_layer_gib(job)
    if layer > have:
        return (
            f"one layer alone needs {layer:,.0f} GiB at parallel.tp={job.mesh.tp} (with its"
            f" gradients and optimizer state), a device has {have:,.0f}: a larger parallel.tp"
        )
    return (
        f"{need / have:,.1f} x a device's memory: split it further (parallel.tp, parallel.pp,"
        " parallel.shard=full) or recompute (trainer.recompute)"
    )


def table(cfg: DictConfig, out: Mapping[str, Any]) -> str:
    mem, comm = out[PLAN_MEMORY.group], out[PLAN_COMM_BYTES_PER_STEP.group]
    snap, step = out[PLAN_MTBF.group], out[PLAN_STEP_TIME.name]
    p = cfg.parallel
    sp = p.sequence_parallel and p.tp > 1
    rows = [
        ("layout", f"dp {p.dp} x pp {p.pp}{f' x cp {p.cp}' if p.cp > 1 else ''} x tp {p.tp}"
         f"{' (+ sp)' if sp else ''}{f' (ep {p.ep} of the dp)' if p.ep > 1 else ''}"
         f" = {out[PLAN_WORLD_SIZE.name]} devices"),
        ("parameters", f"{out[PLAN_PARAMS.name]:,}"
         f" ({_parts(out[PLAN_PARAMS_BY_COMPONENT.group])})"),
        ("memory / device", f"{mem['total']:,.2f} GiB of {out[PLAN_DEVICE_MEMORY.name]:,.0f} at"
         f" its peak ({'fits' if out[PLAN_FITS.name] else 'DOES NOT FIT'}); each part at its most:"
         f" weights {mem['weights']:,.2f},"
         + (f" fp32 masters {mem['master_weights']:,.2f}," if mem["master_weights"] else "")
         + (f" 16-bit copies {mem['weight_copies']:,.2f}," if mem["weight_copies"] else "")
         + f" gradients {mem['gradients']:,.2f}, optimizer {mem['optimizer_state']:,.2f},"
         f" activations {mem['activations']:,.2f}"
         + (f", workspace {mem['workspace']:,.2f}" if mem["workspace"] else "")),
        ("bytes / step / rank", ", ".join(f"{d} {size(comm[d])}" for d in shown_dims(comm))
         + _collectives(out[PLAN_COMM_BYTES_BY_COLLECTIVE.group])),
        ("bubble", f"{out[PLAN_BUBBLE.name]:.3f}"),
        ("step time", f"{step:.4g} s (idle {out[PLAN_IDLE_FRACTION.name]:.1%}): "
         + _shares(out[PLAN_TIME_BY_PART.group], step)),
        *([("to fit", out["to_fit"])] if "to_fit" in out else []),
        ("bound by", out["bound"]),
        ("throughput", f"{out[PLAN_TOKENS_PER_S.name]:,.0f} tokens/s,"
         f" MFU {out[PLAN_MFU.name]:.1%}"),
        ("duration", f"{out[PLAN_HOURS.name]:,.1f} h"),
        ("energy", f"{out[PLAN_ENERGY.name]:,.0f} kWh"),
        ("cost", f"${out[PLAN_COST.name]:,.0f}"),
        ("snapshots", f"every {snap[PLAN_SNAPSHOT_INTERVAL.leaf] / 60:,.0f} min (the job fails"
         f" every {snap[PLAN_MTBF.leaf]:,.1f} h; expected loss {snap[PLAN_WASTE.leaf]:.1%}"
         f", ${snap[PLAN_LOST_COST.leaf]:,.0f})"),
    ]  # fmt: skip
    return "\n".join(f"{name:>20}  {value}" for name, value in rows)


def _collectives(by_collective: Mapping[str, float]) -> str:
    """Sharded data parallelism's collectives, each apart (parallel.shard)."""
    parts = ", ".join(f"{k.split('/')[1]} {size(v)}" for k, v in by_collective.items())
    return f" (dp: {parts})" if parts else ""


def _shares(parts: Mapping[str, float], total: float) -> str:
    return ", ".join(f"{k} {v / total:.0%}" for k, v in parts.items() if v > 0)


def _parts(by_component: Mapping[str, int]) -> str:
    return ", ".join(f"{k} {v / 1e6:,.1f} M" for k, v in by_component.items())


def run(
    cfg: DictConfig, job: Job | None, choices: Mapping[str, str | None], overrides: list[str]
) -> dict[str, Any]:
    from runner.launcher.cluster import world_size

    out = figures(cfg, job)
    # The answer first, then the record: opening the store (importing MLflow, its database) costs
    # more than the arithmetic.
    print(table(cfg, out), flush=True)
    if cfg.plan.json:
        print(json.dumps(out), flush=True)
    from runner.tracking.job_run import recorded_run
    from runner.tracking.store import flat_metrics

    # The figures and their tags go in with the run's own (fewer writes of the store: a sweep
    # of plans records a run a job)
    tags = {"fits": "yes" if out[PLAN_FITS.name] else "no", "bound": out["bound"]}
    with recorded_run(
        cfg, choices, overrides, world_size(cfg), metrics=flat_metrics(out), extra_tags=tags
    ) as record:
        record.client.log_dict(record.run_id, out, "plan.json")
    return out


def shown_dims(comm: dict[str, float]) -> list[str]:
    """The dimensions a plan's bytes are shown for: sequence and context parallelism's where
    they move any."""
    return [d for d in TRAFFIC_DIMS if d not in WHERE_USED or comm.get(d)]
