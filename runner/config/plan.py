"""mode=plan's and mode=report's settings; and their rules."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runner.errors import require
from runner.models.registry import SPECS, spec_for


@dataclass
class PlanConfig:
    """mode=plan: no training; the model on the meta device, the job priced on the hardware."""

    hours: float | None = None  # a duration to price ...
    tokens: float | None = None  # ... or a token (sample) budget; neither: trainer.max_steps
    json: bool = False  # print one JSON object as the last line of standard output
    # Pipeline sends between tensor-parallel groups split over their ranks, each sending 1/tp and
    # all-gathering the rest over the tensor-parallel link (Megatron-LM's scatter/gather;
    # Narayanan et al. 2021, section 4.1). Priced by mode=plan only: training sends it whole.
    scatter_gather: bool = False
    # Failures: Meta's Llama 3 405B run saw 419 interruptions in 54 days on 16,384 GPUs, one per
    # ~3.1 h for the job, ~51,000 h per GPU (Dubey et al. 2024, section 3.3.4).
    device_mtbf_hours: float = 50_000.0
    snapshot_write_s: float = 60.0  # time to write one snapshot of the job's state


@dataclass
class ReportConfig:
    """mode=report: a sweep's predicted figures next to its measured ones."""

    sweep: str | None = None  # the sweep's parent run id; None: the newest sweep


def check_plan(p: Any, model: Any) -> None:
    require(
        spec_for(model) is not None,
        "model",
        f"the planner sizes the models of runner/models/ only ({', '.join(SPECS)})",
    )
    require(p.hours is None or p.tokens is None, "plan.hours", "give plan.hours or plan.tokens")
    for key in ("hours", "tokens"):
        require(p[key] is None or p[key] > 0, f"plan.{key}", f"must be positive, got {p[key]}")
