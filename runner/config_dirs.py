"""Where the configs are: `conf/` (Hydra's groups) and `experiments/` (the studies) at the top of
a checkout; inside the package (runner/conf, runner/experiments) where a wheel installed it
(setup.py maps them there). A user's own ./conf and ./experiments, in the folder a command runs
from, come before both (plugins/hydra_plugins/runner_studies)."""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parent


def _found(name: str) -> Path:
    installed = PACKAGE / name
    return installed if installed.is_dir() else PACKAGE.parent / name


CONF_DIR = _found("conf")
EXPERIMENTS_DIR = _found("experiments")
