"""A sweep compared on its parent run: one row per job, the figures people compare, as a table
(comparison.csv, comparison.md) and a chart (comparison.png), so that one page of the MLflow UI
shows which job of the sweep did what, without choosing columns by hand.
"""

from __future__ import annotations

import csv
import io
import math
import textwrap
import warnings
from collections.abc import Callable
from dataclasses import dataclass

from mlflow import MlflowClient
from mlflow.entities import Run

from runner.mesh import TRAFFIC_DIMS
from runner.metrics import (
    COMM_BYTES_PER_STEP,
    COST,
    IDLE_FRACTION,
    MFU,
    PEAK_MEMORY,
    PLAN_MEMORY,
    STEP_TIME,
    THROUGHPUT,
    TRAIN_LOSS,
)
from runner.tracking.pictures import Figure
from runner.tracking.store import children


@dataclass(frozen=True)
class Column:
    name: str  # the table's heading
    read: Callable[[MlflowClient, Run], float | None]
    shown: str  # how a cell reads: a format spec


def metric(*keys: str) -> Callable[[MlflowClient, Run], float | None]:
    """The first of the keys the run has: a training run measures what a plan predicts."""
    return lambda _, run: next((run.data.metrics[k] for k in keys if k in run.data.metrics), None)


def final_loss(client: MlflowClient, run: Run) -> float | None:
    if TRAIN_LOSS.name not in run.data.metrics:  # no loss logged (a plan): no history to read
        return None
    history = client.get_metric_history(run.info.run_id, TRAIN_LOSS.name)
    return max(history, key=lambda m: m.step).value if history else None


def bytes_per_step(_: MlflowClient, run: Run) -> float | None:
    """Every mesh dimension's bytes per step and rank (not the per-collective split below it):
    what a training run measured, or a plan predicts, under the same names."""
    keys = [COMM_BYTES_PER_STEP.at(dim=dim) for dim in TRAFFIC_DIMS]
    dims = [run.data.metrics[k] for k in keys if k in run.data.metrics]
    return sum(dims) if dims else None


LABELS = ("job", "run", "status")
LABEL_CHARS = 28  # a label's line beside a bar, at 8 points
COLUMNS = (
    Column(f"final {TRAIN_LOSS.name}", final_loss, ".4f"),
    Column("samples/s", metric(THROUGHPUT.name), ",.1f"),
    Column("step time (s)", metric(STEP_TIME.name), ".4g"),
    Column("idle fraction", metric(IDLE_FRACTION.name), ".1%"),
    Column("bytes/step", bytes_per_step, ",.0f"),
    Column(
        "peak memory (GiB)", metric(PEAK_MEMORY.name, PLAN_MEMORY.at(memory_part="total")), ".3g"
    ),
    Column("MFU", metric(MFU.name), ".2%"),
    Column("cost (USD)", metric(COST.name), ".3g"),
)


def differences(names: list[str]) -> list[str]:
    """What tells the jobs apart: the words of a run's name that not every job's name shares."""
    words = [name.split() for name in names]
    common = set.intersection(*map(set, words)) if len(words) > 1 else set()
    return [" ".join(w for w in ws if w not in common) for ws in words]


def rows(client: MlflowClient, runs: list[Run]) -> tuple[list[str], list[dict[str, object]]]:
    """The table: a job's number (the chart's #N), name and status, then each figure any job has
    (None where it has not)."""
    values = [{c.name: c.read(client, run) for c in COLUMNS} for run in runs]
    shown = [c.name for c in COLUMNS if any(v[c.name] is not None for v in values)]
    table = [
        {"job": i, "run": run.info.run_name, "status": run.info.status} | {k: v[k] for k in shown}
        for i, (run, v) in enumerate(zip(runs, values, strict=True), 1)
    ]
    return [*LABELS, *shown], table


def names_of(table: list[dict[str, object]]) -> list[str]:
    return [str(row["run"]) for row in table]


def as_csv(header: list[str], table: list[dict[str, object]]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, header, lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: "" if v is None else v for k, v in row.items()} for row in table)
    return out.getvalue()


def as_markdown(header: list[str], table: list[dict[str, object]]) -> str:
    formats = {c.name: c.shown for c in COLUMNS}

    def cell(key: str, value: object) -> str:
        if value is None:
            return ""
        return format(value, formats[key]) if key in formats else str(value).replace("|", "\\|")

    # A job's name less what every job shares: the table stays narrow enough to read.
    named = [row | {"run": d} for row, d in zip(table, differences(names_of(table)), strict=True)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(k, row[k]) for k in header) + " |" for row in named]
    return "\n".join(lines) + "\n"


def chart(header: list[str], table: list[dict[str, object]], title: str) -> Figure:
    """A bar per job for each figure, a panel per figure, the jobs by what tells them apart."""
    figures = header[len(LABELS) :]
    labels = [
        textwrap.fill(f"#{row['job']} {d}".strip(), LABEL_CHARS)
        for row, d in zip(table, differences(names_of(table)), strict=True)
    ]
    columns = 2 if len(figures) > 1 else 1
    lines = math.ceil(len(figures) / columns)
    fig = Figure(figsize=(6 * columns, 0.6 + lines * (0.9 + 0.3 * len(table))), layout="tight")
    for i, key in enumerate(figures):
        ax = fig.add_subplot(lines, columns, i + 1)
        values = [row[key] for row in table]
        ax.barh(range(len(table)), [math.nan if v is None else v for v in values], color="#4C72B0")
        ax.set_yticks(range(len(table)), labels, fontsize=8)
        ax.invert_yaxis()  # the first job on top, as in the table
        # Where matplotlib puts a title with nothing above the panel (the y axis names jobs: no
        # offset text): given, it spares measuring every tick label again to look for overlaps,
        # a fifth of the picture's time (the same pixels)
        ax.set_title(key, fontsize=9, y=1.0)
        ax.tick_params(axis="x", labelsize=8)
    fig.suptitle(textwrap.fill(title, 120), fontsize=10)
    return fig


def log_comparison(client: MlflowClient, parent_id: str) -> list[Run]:
    """Log the sweep's comparison on its parent run (nothing for a sweep that ran no job); the
    job runs it compared."""
    parent = client.get_run(parent_id)
    runs = children(client, parent)
    if not runs:
        return runs
    header, table = rows(client, runs)
    client.log_text(parent_id, as_csv(header, table), "comparison.csv")
    client.log_text(parent_id, as_markdown(header, table), "comparison.md")
    if len(header) > len(LABELS):
        picture = chart(header, table, parent.info.run_name)
        # A label too wide for tight layout only crowds the picture; a warning after a sweep's
        # error line would hide that line.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            client.log_figure(parent_id, picture, "comparison.png")
    return runs
