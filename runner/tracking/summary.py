"""The few lines every run and sweep ends with: what it was, how it ended, its headline figures,
where it is recorded and the command that shows it. On stderr: stdout stays the run's own answer
(a plan's JSON line, a printed config)."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Callable

from mlflow import MlflowClient
from mlflow.entities import Run

from runner.metrics import COST, IDLE_FRACTION, THROUGHPUT, TRAIN_LOSS
from runner.stragglers import TAG as STRAGGLER
from runner.tracking.store import children

HEADLINE: tuple[tuple[str, Callable[[float], str]], ...] = (  # (metric, how it reads)
    (THROUGHPUT.name, lambda v: f"{v:,.0f} samples/s"),
    (IDLE_FRACTION.name, lambda v: f"idle {v:.0%}"),
    (COST.name, lambda v: f"${v:,.2f}" if v >= 0.01 else f"${v:.1e}"),
)


def figures_line(client: MlflowClient, run_id: str, metrics: dict[str, float]) -> str:
    # A run that logged a loss has its latest among its metrics: the history only then (a plan's
    # run, a sweep's many, have none)
    logged = TRAIN_LOSS.name in metrics
    losses = client.get_metric_history(run_id, TRAIN_LOSS.name) if logged else []
    shown = [f"final loss {max(losses, key=lambda m: m.step).value:.4f}"] if losses else []
    shown += [shown_as(metrics[key]) for key, shown_as in HEADLINE if key in metrics]
    return " | ".join(shown)


ANSWER_WIDTH = 100  # a terminal's lines
UI = "http://127.0.0.1:5000"  # where `mlflow ui` serves by default
# MLflow 3's UI opens an experiment as the browser last chose (GenAI or model training, GenAI at
# first); this parameter opens it on its training runs whatever the browser chose before.
TRAINING_VIEW = "?workflowType=machine_learning"


def page(experiment_id: str, run_id: str | None = None) -> str:
    """The UI's page of an experiment's runs, or of one run, after the server's address."""
    run = f"/runs/{run_id}" if run_id else ""
    return f"/#/experiments/{experiment_id}{run}{TRAINING_VIEW}"


def where(tracking_uri: str, experiment: str, shown: str) -> list[str]:
    """Where the record is and how to look at it: a server's own page, or a store's `mlflow ui`."""
    lines = [f"  recorded in {tracking_uri}, experiment {experiment}"]
    if tracking_uri.startswith(("http://", "https://")):
        return [*lines, f"  see it: {tracking_uri.rstrip('/')}{shown}"]
    return [
        *lines,
        f"  see it: mlflow ui --backend-store-uri {tracking_uri}",
        f"  then open {UI}{shown}",
    ]


def print_run_summary(
    client: MlflowClient, run_id: str, tracking_uri: str, experiment: str | None = None
) -> None:
    """`experiment`: the run's experiment's name, where the caller knows it (one read fewer)."""
    run = client.get_run(run_id)
    experiment = experiment or client.get_experiment(run.info.experiment_id).name
    lines = [f"run {run.info.run_name} ({run_id}): {run.info.status}"]
    figures = figures_line(client, run_id, run.data.metrics)
    lines += [f"  {figures}"] if figures else []
    if STRAGGLER in run.data.tags:
        lines += [f"  straggler: {run.data.tags[STRAGGLER]}"]
    shown = page(run.info.experiment_id, run_id)
    print("\n".join(lines + where(tracking_uri, experiment, shown)), file=sys.stderr, flush=True)


def print_sweep_summary(
    client: MlflowClient,
    parent_id: str,
    tracking_uri: str,
    answer: str | None = None,
    jobs: list[Run] | None = None,
) -> None:
    """How the sweep ended and where it is; last, a study's answer (runner/studies/report.py).
    `jobs`: the sweep's job runs, where the caller has just read them (its comparison)."""
    parent = client.get_run(parent_id)
    jobs = children(client, parent) if jobs is None else jobs
    ended = sorted({c.info.status for c in jobs})
    counts = ", ".join(f"{sum(c.info.status == s for c in jobs)} {s}" for s in ended)
    experiment = client.get_experiment(parent.info.experiment_id).name
    lines = [f"sweep {parent.info.run_name} ({parent_id}): {len(jobs)} jobs, {counts}"]
    if jobs:  # runner/tracking/comparison.py compared them
        lines += ["  compared on the sweep's run: comparison.md, comparison.csv, comparison.png"]
    if answer:
        lines += ["  answered on the sweep's run: report.md, charts/"]
    shown = page(parent.info.experiment_id)  # the parent's row opens onto its jobs
    lines += where(tracking_uri, experiment, shown)
    if answer:
        lines += [textwrap.fill(f"answer: {answer}", ANSWER_WIDTH, subsequent_indent="  ")]
    print("\n".join(lines), file=sys.stderr, flush=True)
