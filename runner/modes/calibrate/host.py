"""hardware.figures=host: a job priced with this host's own figures, measured by mode=calibrate's
measure once per host (runner/planner/host_figures.py keys and keeps them) and merged over its
CPU profile's before the job is planned. A study runs the calibration before its first job
(plugins/hydra_plugins/runner_mlflow_sweep), at the study's own model, precision and threads a
rank, one process, no layout; a single job finds it there or calibrates first."""

from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from runner.config import ParallelConfig
from runner.errors import require
from runner.launcher.cluster import external_launcher
from runner.planner.host_figures import Calibrated, Host, load, save


def calibration_of(cfg: DictConfig) -> DictConfig:
    """The job as mode=calibrate measures it: one process at the profile's threads a rank, the
    parallel group's defaults (no layout), the profile's own figures."""
    out = copy.deepcopy(cfg)
    with open_dict(out):
        out.pop("hydra", None)  # a sweep's own config (the study's callback): Hydra's node too
        out.mode = "calibrate"
        out.parallel = OmegaConf.structured(ParallelConfig)
        out.hardware.devices = 1
        out.hardware.nodes = 1
        out.hardware.figures = "profile"
        out.hardware.emulate_network.enabled = False
    return out


def where(cfg: DictConfig, choices: Mapping[str, str | None]) -> tuple[Host, Calibrated]:
    """This host, and what its calibration for the job measures."""
    what = Calibrated(
        profile=choices.get("hardware") or "cpu",
        model=choices.get("model") or "model",
        precision=cfg.trainer.precision,
        split=(cfg.parallel.tp or 1) > 1,
    )
    return Host.here(cfg.hardware.threads_per_rank), what


def calibrate(cfg: DictConfig, choices: Mapping[str, str | None]) -> dict[str, Any]:
    """Measure this host at the job's profile and model, keep the figures, hand them back."""
    from runner.modes.calibrate import figures_of, measure_all
    from runner.precision import precision_of
    from runner.validate import check, resolve_mesh

    host, what = where(cfg, choices)
    path = what.path(host)
    print(f"hardware.figures=host: calibrating this host ({host}), {what}: once, kept in {path}",
          flush=True)  # fmt: skip
    start = time.perf_counter()
    calib = calibration_of(cfg)
    job = check(calib, resolve_mesh(calib))
    # What the job computes at, and DTensor's cost on the model itself where it splits layers:
    # the rest (bf16 on a CPU without bf16 instructions: seconds a size) would price nothing.
    keys = (precision_of(job.trainer).compute,)
    save(path, host, what, figures_of(measure_all(calib, job, keys, split=what.split)))
    print(f"hardware.figures=host: calibrated in {time.perf_counter() - start:.0f} s", flush=True)
    return load(path) or {}


def ensure(cfg: DictConfig, choices: Mapping[str, str | None]) -> dict[str, Any]:
    """This host's kept figures for the job, calibrating first where there are none (not under
    torchrun or SLURM, whose every rank would: there it says how to calibrate first)."""
    host, what = where(cfg, choices)
    # A calibration that also split the model measured everything one that did not does
    for found in dict.fromkeys([what, dataclasses.replace(what, split=True)]):
        kept = load(found.path(host))
        if kept is not None:
            return kept
    require(
        external_launcher() is None,
        "hardware.figures",
        f"host: this host ({host}) has no calibration for {what} yet; run `python -m runner "
        f"mode=calibrate hardware={what.profile} model={what.model} "
        f"trainer.precision={what.precision}` on it first",
    )
    return calibrate(cfg, choices)


def price_with_host(cfg: DictConfig, choices: Mapping[str, str | None]) -> None:
    """Merge this host's figures over the job's profile, in place; `hardware.calibrated` says
    which calibration priced it (a run tag, and a study's answer, name it)."""
    kept = ensure(cfg, choices)
    with open_dict(cfg):
        cfg.hardware = OmegaConf.merge(cfg.hardware, kept["figures"])
        cfg.hardware.calibrated = kept["priced_by"]
