"""A sweep's MLflow parent run (opened by plugins/hydra_plugins/runner_mlflow_sweep): every job's
run is nested under it, and when the sweep ends it compares its jobs
(runner/tracking/comparison.py), answers its study's question if it is a study's
(runner/studies/report.py), and says how it ended (runner/tracking/summary.py)."""

from __future__ import annotations

import contextlib
import os
from typing import Any

from mlflow.exceptions import MlflowException
from mlflow.utils.mlflow_tags import MLFLOW_RUN_NOTE
from omegaconf import OmegaConf

from runner.studies.report import log_study
from runner.tracking import open_sweep
from runner.tracking.comparison import log_comparison
from runner.tracking.store import (
    OWNER_TAG,
    PARENT_RUN_ENV,
    PARENT_URI_ENV,
    Run,
    open_experiment,
    owner,
)
from runner.tracking.summary import print_sweep_summary

_parent: Run | None = None  # the sweep's parent run, while this process has one open
_study: dict[str, Any] | None = None  # the study it answers, if it is a study's


def start_parent(tracking_uri: str, experiment_name: str, name: str, study: Any = None) -> Run:
    """Open the parent run; a study's (runner/config/study.py) has its question as description."""
    global _parent, _study
    client, exp = open_experiment(tracking_uri, experiment_name)
    tags = {"mode": "sweep", OWNER_TAG: owner()}
    _study = OmegaConf.to_container(study) if study is not None else None  # type: ignore[assignment]
    if _study:
        tags[MLFLOW_RUN_NOTE] = _study["question"]
    created = client.create_run(exp, run_name=name, tags=tags)
    _parent = Run(client, created.info.run_id)
    os.environ[PARENT_URI_ENV] = tracking_uri  # for the sweep's summary
    os.environ[PARENT_RUN_ENV] = _parent.run_id
    # The error line of a sweep that stops part-way stays the last: no summary after it.
    open_sweep.opened(lambda: end_parent("FAILED", summary=False))
    return _parent


def end_parent(status: str, summary: bool = True) -> None:
    """End the sweep's parent run if this process opened one that is still open, with its jobs
    compared, and say how it ended (not when an error line must stay the last)."""
    global _parent, _study
    if _parent is None:
        return
    said = jobs = None
    with contextlib.suppress(MlflowException):  # a store that failed the sweep: its error speaks
        jobs = log_comparison(_parent.client, _parent.run_id)
        if _study:
            said = log_study(_parent.client, _parent.run_id, _study)
    _parent.end(status)
    if summary:
        uri = os.environ[PARENT_URI_ENV]
        with contextlib.suppress(MlflowException):  # the jobs compared: read once
            print_sweep_summary(_parent.client, _parent.run_id, uri, said, jobs)
    _parent, _study = None, None
    open_sweep.closed()
    os.environ.pop(PARENT_RUN_ENV, None)
    os.environ.pop(PARENT_URI_ENV, None)
