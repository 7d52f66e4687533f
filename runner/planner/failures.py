"""What failures cost, and how often to take a snapshot against them (the seed's warning: without
one, a lost rank sends months of training back to the start).

A job of n devices, each failing on average once every `device_mtbf_hours`, fails once every
M = device_mtbf / n. Snapshots every tau seconds, each taking delta to write, waste delta / tau of
the time writing them and, per failure, on average half an interval of work plus the write:
waste(tau) = delta / tau + (tau + delta) / (2 M), least at Young's (1974) interval sqrt(2 delta M).
Daly (2006), with restart time and higher-order terms, moves it to about sqrt(2 delta M) - delta:
the same to within the write time, small next to it wherever snapshots pay.
"""

from __future__ import annotations

import math

from runner.config import HardwareConfig, PlanConfig
from runner.metrics import (
    COST,
    ENERGY,
    LOST_COST,
    LOST_ENERGY,
    LOST_STEPS,
    LOST_TIME,
    PLAN_LOST_COST,
    PLAN_MTBF,
    PLAN_SNAPSHOT_INTERVAL,
    PLAN_WASTE,
    Metric,
)
from runner.planner.hardware import power_per_device_w


def energy_kwh(hw: HardwareConfig, world: int, seconds: float) -> float:
    """Energy the job's devices draw in that time, with the facility's overhead (PUE)."""
    return world * power_per_device_w(hw) * hw.pue * seconds / 3.6e6


def priced(
    hw: HardwareConfig, world: int, seconds: float, names: tuple[Metric, Metric] = (ENERGY, COST)
) -> dict[str, float]:
    """Energy and cost of the job's devices for that long, under `names`: `energy_kwh`,
    `cost_usd` by default."""
    kwh = energy_kwh(hw, world, seconds)
    energy, cost = names
    return {energy.name: kwh, cost.name: kwh * hw.usd_per_kwh}


def lost_work(hw: HardwareConfig, world: int, steps: int, seconds: float) -> dict[str, float]:
    """Work a failure throws away: everything since the last snapshot (without one, since the
    start), priced as the devices' time it took."""
    return {LOST_STEPS.name: float(steps), LOST_TIME.name: seconds} | priced(
        hw, world, seconds, (LOST_ENERGY, LOST_COST)
    )


def waste_fraction(interval_s: float, write_s: float, mtbf_s: float) -> float:
    return write_s / interval_s + (interval_s + write_s) / (2 * mtbf_s)


def snapshot_interval_s(write_s: float, mtbf_s: float) -> float:
    """Young's interval: where the waste above is least."""
    return math.sqrt(2 * write_s * mtbf_s)


def snapshot_plan(plan: PlanConfig, world: int, cost_usd: float) -> dict[str, float]:
    mtbf_s = plan.device_mtbf_hours * 3600 / world
    write_s = plan.snapshot_write_s
    interval = snapshot_interval_s(write_s, mtbf_s)
    waste = waste_fraction(interval, write_s, mtbf_s)
    return {  # the plan's figures under `snapshots`
        PLAN_MTBF.leaf: mtbf_s / 3600,
        PLAN_SNAPSHOT_INTERVAL.leaf: interval,
        PLAN_WASTE.leaf: waste,
        PLAN_LOST_COST.leaf: waste * cost_usd,
    }
