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
from runner.planner.hardware import power_per_device_w


def energy_kwh(hw: HardwareConfig, world: int, seconds: float) -> float:
    """Energy the job's devices draw in that time, with the facility's overhead (PUE)."""
    return world * power_per_device_w(hw) * hw.pue * seconds / 3.6e6


def priced(hw: HardwareConfig, world: int, seconds: float, prefix: str = "") -> dict[str, float]:
    """Energy and cost of the job's devices for that long: `energy_kwh`, `cost_usd`."""
    kwh = energy_kwh(hw, world, seconds)
    return {f"{prefix}energy_kwh": kwh, f"{prefix}cost_usd": kwh * hw.usd_per_kwh}


def lost_work(hw: HardwareConfig, world: int, steps: int, seconds: float) -> dict[str, float]:
    """Work a failure throws away: everything since the last snapshot (without one, since the
    start), priced as the devices' time it took."""
    return {"lost_steps": float(steps), "lost_time_s": seconds} | priced(
        hw, world, seconds, "lost_"
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
    return {
        "job_mtbf_hours": mtbf_s / 3600,
        "snapshot_interval_s": interval,
        "expected_waste_fraction": waste,
        "expected_lost_cost_usd": waste * cost_usd,
    }
