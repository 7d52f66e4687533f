"""Jobs composed and trained by the test's own process, as the command line would run them."""

from __future__ import annotations

import copy
import functools
import os
import shutil
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, open_dict

from runner.config import register_configs
from runner.config_dirs import CONF_DIR
from tests.helpers.records import all_runs

register_configs()  # the runner's structured configs, which every composition reads

# Small, quick settings for tests that train: the defaults are sized for a one-minute demo.
# One validation batch: 8 (the default) every 4 steps cost as much as the training steps.
QUICK = [
    "trainer.progress_bar=false",
    "trainer.warmup_steps=2",
    "trainer.val_every_n_steps=4",
    "trainer.val_batches=1",
]
DP2 = ["parallel=data", "hardware.devices=2"]  # two data-parallel processes on this host

REPOSITORY = Path(__file__).resolve().parents[2]


def copy_of_the_repository(dest: Path) -> Path:
    """The code and the configs, for commands that must run the code as a document shows it."""
    for part in ("runner", "plugins", "benchmarks", "conf", "experiments"):
        if (REPOSITORY / part).exists():
            shutil.copytree(REPOSITORY / part, dest / part, symlinks=True)
    return dest


def compose_job(*overrides: str) -> tuple[DictConfig, dict[str, str | None]]:
    """The job config and the group choices, as Hydra hands them to a job: a copy of its own,
    free to change."""
    cfg, choices = composed(overrides, os.getcwd())
    return copy.deepcopy(cfg), dict(choices)


@functools.lru_cache(maxsize=256)
def composed(overrides: tuple[str, ...], cwd: str) -> tuple[DictConfig, dict[str, str | None]]:
    """Hydra's composition, once per set of overrides and folder (./conf is on its search path):
    a third of a second each, and the suite composes the same jobs many times."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=list(overrides), return_hydra_config=True)
    choices = dict(cfg.hydra.runtime.choices)
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg, choices


def train(*overrides: str) -> str:
    """Run one training job in-process, as the CLI would; return its MLflow run id."""
    from runner.app import run_job

    cfg, choices = compose_job(*QUICK, *overrides)
    before = {r.info.run_id for r in all_runs(cfg.logger.tracking_uri)}
    run_job(cfg, choices, list(overrides))
    (new,) = {r.info.run_id for r in all_runs(cfg.logger.tracking_uri)} - before
    return new


def planned(*overrides: str) -> dict[str, Any]:
    """What mode=plan answers for the job (runner/planner/__init__.py: plan), without a run."""
    from runner import validate
    from runner.job import resolve_job
    from runner.planner import plan

    cfg, _ = compose_job(*overrides)
    validate.validate(cfg)
    return plan(resolve_job(cfg))


def searched(*overrides: str) -> Any:
    """What mode=search finds for the job (runner/modes/search.py: search), without a run."""
    from runner import validate
    from runner.config.search import SearchConfig
    from runner.job import resolve_job, typed
    from runner.modes.search import search

    cfg, _ = compose_job("mode=search", *overrides)
    validate.validate(cfg)
    return search(cfg, resolve_job(cfg), typed(SearchConfig, cfg.search))
