"""Whether a run logged only names runner/metrics.py registers: a figure logged under any other
name is one the docs, the summary, the comparison and the report know nothing of."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from runner.metrics import registered


def unregistered(metrics: Mapping[str, float], mode: str | None = None) -> list[str]:
    """The keys no entry of that mode (any mode: None) registers."""
    return sorted(key for key in metrics if registered(key, mode) is None)


def assert_registered(run: Any) -> None:
    """Every metric an MLflow run logged is registered for the run's mode (its tag `mode`)."""
    mode = run.data.tags["mode"]
    assert unregistered(run.data.metrics, mode) == [], f"not in runner/metrics.py for mode={mode}"


def assert_peak_as_planned(metrics: Mapping[str, float]) -> None:
    """The planner's peak as the step holds it (runner/planner/memory.py) within 15 % of the
    tensors' measured peak (malloc's bytes in use on a CPU, CUDA's on a GPU)."""
    ratio = metrics["pred/peak_memory_gib"] / metrics["peak_allocated_gib"]
    assert 0.85 < ratio < 1.15, (ratio, metrics["pred/peak_memory_gib"])
