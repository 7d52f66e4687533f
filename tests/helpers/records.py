"""What a job recorded in MLflow, read back: its runs, its losses step by step, and whether a
resume repeated the steps it redid."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from mlflow import MlflowClient

from runner.metrics import TRAIN_LOSS


def all_runs(tracking_uri: str) -> list:
    client = MlflowClient(tracking_uri)
    experiments = [e.experiment_id for e in client.search_experiments()]
    return client.search_runs(experiments) if experiments else []


def loss_series(tracking_uri: str, run_id: str, key: str = TRAIN_LOSS.name) -> list[float]:
    history = MlflowClient(tracking_uri).get_metric_history(run_id, key)
    return [m.value for m in sorted(history, key=lambda m: m.step)]


def losses_by_step(tracking_uri: str, run_id: str) -> list[float]:
    """The loss of every step; a step redone after a resume counts once (its last value)."""
    return [values[-1] for values in logged_per_step(tracking_uri, run_id).values()]


def logged_per_step(tracking_uri: str, run_id: str) -> dict[int, list[float]]:
    """Each step's losses in the order they were logged: a step redone after a resume has two."""
    history = MlflowClient(tracking_uri).get_metric_history(run_id, TRAIN_LOSS.name)
    by_step: dict[int, list[float]] = {}
    for m in sorted(history, key=lambda m: (m.step, m.timestamp)):
        by_step.setdefault(m.step, []).append(m.value)
    return by_step


RESUME_RELATIVE = 1e-6  # a resumed run repeats the same arithmetic: the bound


def assert_redone_steps_repeat(tracking_uri: str, run_id: str, redone: range) -> None:
    """The steps a resume redid gave the losses the run had logged for them the first time."""
    per_step = logged_per_step(tracking_uri, run_id)
    assert {s for s, values in per_step.items() if len(values) == 2} == set(redone), per_step
    first, again = zip(*(per_step[s] for s in redone), strict=True)
    assert list(again) == pytest.approx(list(first), rel=RESUME_RELATIVE)


def forget_snapshots_of_step(root: Path, step: int) -> None:
    """Remove every run's snapshot of that step under root, as if the jobs had stopped before."""
    for folder in root.glob(f"**/step_{step:08d}"):
        shutil.rmtree(folder)
