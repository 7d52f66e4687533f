"""One job: resolve its mesh, check it, then run its mode (runner/modes/), recorded in one MLflow
run."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig

from runner import choices
from runner.launcher import collector
from runner.validate import check, resolve_mesh

# mode -> its module under runner/modes/, imported only when chosen (training imports torch).
MODES = {mode: f"runner.modes.{mode}" for mode in choices.MODES}


def run_job(
    cfg: DictConfig, choices: Mapping[str, str | None], overrides: list[str]
) -> dict[str, Any]:
    # Before anything heavy is imported or any run is opened: the mesh's sizes, then the checks,
    # which resolve the typed job once for the mode.
    job = check(cfg, resolve_mesh(cfg))
    if cfg.hardware.figures == "host" and cfg.mode in ("train", "plan", "search"):
        from runner.modes.calibrate.host import price_with_host  # measures: imports torch

        price_with_host(cfg, choices)  # this host's figures over the profile's
        job = check(cfg, resolve_mesh(cfg))
    mode = importlib.import_module(MODES[cfg.mode])
    if cfg.mode != "train":  # training resumes it after its own imports (runner/modes/train.py)
        collector.resume()
    return mode.run(cfg, job, choices, overrides)
