"""mode=report: how far to trust the planner. A sweep's runs, each figure predicted next to
measured: a table, a picture, the error per figure, and whether the planner ranks the layouts in
the order the measurements do (Spearman's rank correlation of step time and of peak memory).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from statistics import median
from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from mlflow import MlflowClient
from mlflow.entities import Run as MlflowRun
from omegaconf import DictConfig
from scipy.stats import spearmanr

from runner.errors import ConfigError
from runner.job import Job
from runner.mesh import TRAFFIC_DIMS
from runner.metrics import (
    BUBBLE_MEASURED,
    COMM_BYTES_PER_STEP,
    IDLE_FRACTION,
    MFU,
    PEAK_MEMORY,
    REPORT_ERROR,
    REPORT_RUNS,
    REPORT_SPEARMAN,
    STEP_TIME,
    prediction,
)
from runner.tracking.store import client_of, experiment_id

# measured metric -> its prediction
FIGURES = {
    key: prediction(key)
    for key in (
        STEP_TIME.name,
        PEAK_MEMORY.name,
        MFU.name,
        IDLE_FRACTION.name,
        BUBBLE_MEASURED.name,
        *(COMM_BYTES_PER_STEP.at(dim=dim) for dim in TRAFFIC_DIMS),
    )
}
# The figures ranked, tabled and drawn: measured metric -> (table heading, axis label). Step time
# says which layout is fastest, peak memory which fit; every training run has step time (it is
# what makes a run comparable), an older one may lack memory.
COMPARED = {
    STEP_TIME.name: ("step s", "step time (s)"),
    PEAK_MEMORY.name: ("peak GiB", "peak memory (GiB)"),
}
Pair = tuple[MlflowRun, float, float]  # a run, its measured figure and the prediction


def sweep_runs(client: MlflowClient, cfg: DictConfig) -> tuple[str, list[MlflowRun]]:
    """report.sweep's finished training runs, or the newest sweep's that has 2 or more (a newer
    sweep of plans, mode=plan, has none to compare)."""
    exp = experiment_id(client, cfg.logger.experiment_name)
    if cfg.report.sweep is not None:
        sweep = cfg.report.sweep
        trained, finished = training_runs(client, exp, sweep)
        if len(trained) < 2:
            kinds = sorted({r.data.tags.get("mode", "?") for r in finished} - {"train"})
            held = f"; it holds {', '.join(kinds)} runs, not training runs" if kinds else ""
            raise ConfigError(
                "report.sweep", f"{sweep} has {len(trained)} finished training run(s){held}"
            )
        return sweep, trained
    sweeps = client.search_runs(
        [exp], "tags.mode = 'sweep'", order_by=["attributes.start_time DESC"]
    )
    for newest in sweeps:
        trained, _ = training_runs(client, exp, newest.info.run_id)
        if len(trained) >= 2:
            return newest.info.run_id, trained
    raise ConfigError(
        "report.sweep",
        f"none of the {len(sweeps)} sweep(s) in this experiment has 2 finished training runs: "
        "run one with -m first (a sweep of mode=plan trains nothing)",
    )


def training_runs(
    client: MlflowClient, exp: str, sweep: str
) -> tuple[list[MlflowRun], list[MlflowRun]]:
    """The sweep's finished training runs with a step time measured and predicted, oldest first;
    and all its finished runs."""
    runs = client.search_runs(
        [exp], f"tags.`mlflow.parentRunId` = '{sweep}' and attributes.status = 'FINISHED'"
    )
    trained = [
        r
        for r in runs
        if r.data.tags.get("mode") == "train"
        and {STEP_TIME.name, prediction(STEP_TIME.name)} <= r.data.metrics.keys()
    ]
    return sorted(trained, key=lambda r: r.info.start_time), runs


def pairs(runs: list[MlflowRun], figure: str) -> list[Pair]:
    """The runs that have `figure` measured (above 0: errors are relative to it, and the picture is
    log-log) and predicted, each with the two."""
    predicted = FIGURES[figure]
    return [
        (r, r.data.metrics[figure], r.data.metrics[predicted])
        for r in runs
        if predicted in r.data.metrics and r.data.metrics.get(figure, 0) > 0
    ]


def sides(found: list[Pair]) -> tuple[list[float], list[float]]:
    """The measured and the predicted values of `pairs`."""
    return [m for _, m, _ in found], [p for _, _, p in found]


def errors(runs: list[MlflowRun]) -> dict[str, list[float]]:
    """Relative error (predicted - measured) / measured of every figure a run has both of."""
    found = {f: [(p - m) / m for _, m, p in pairs(runs, f)] for f in FIGURES}
    return {f: e for f, e in found.items() if e}


def summary(runs: list[MlflowRun]) -> dict[str, float]:
    out = {REPORT_ERROR.at(figure=k): median(abs(e) for e in v) for k, v in errors(runs).items()}
    for figure in COMPARED:
        measured, predicted = sides(pairs(runs, figure))
        # A rank correlation needs 2 runs, and is undefined where either side is all one value
        # (a sweep of data-parallel widths predicts the same memory for each).
        if len(set(measured)) > 1 and len(set(predicted)) > 1:
            out[REPORT_SPEARMAN.at(figure=figure)] = float(spearmanr(predicted, measured).statistic)
    out[REPORT_RUNS.name] = float(len(runs))
    return out


def compared(runs: list[MlflowRun]) -> list[str]:
    """The figures of COMPARED that at least one run has both of."""
    return [f for f in COMPARED if pairs(runs, f)]


def cells(run: MlflowRun, figure: str) -> str:
    """A run's measured, predicted and error of `figure`, "-" in each where it lacks them."""
    width = len(f"{COMPARED[figure][0]} measured")
    found = pairs([run], figure)
    if not found:
        return f" {'-':>{width}} {'-':>10} {'-':>8}"
    _, meas, pred = found[0]
    return f" {meas:>{width}.4f} {pred:>10.4f} {pred / meas - 1:>+8.1%}"


def table(runs: list[MlflowRun], result: Mapping[str, float]) -> str:
    shown = compared(runs)
    head = "".join(f" {COMPARED[f][0]} measured {'predicted':>10} {'error':>8}" for f in shown)
    width = max(len("run"), *(len(r.info.run_name) for r in runs)) + 2  # names whole: they differ
    lines = [f"{'run':<{width}}{head}"]  # at their ends (parallel.microbatches=1, =2, ...)
    lines += [f"{r.info.run_name:<{width}}" + "".join(cells(r, f) for f in shown) for r in runs]
    lines.append("")
    lines += [f"{k}: {v:.3f}" for k, v in result.items()]
    return "\n".join(lines)


def title(figure: str, runs: int, result: Mapping[str, float]) -> str:
    rank = result.get(REPORT_SPEARMAN.at(figure=figure))  # none from fewer than 2 runs
    ranked = "" if rank is None else f", Spearman {rank:.2f}"
    return f"median |error| {result[REPORT_ERROR.at(figure=figure)]:.0%}{ranked}, {runs} runs"


def panel(ax: Axes, runs: list[MlflowRun], figure: str, result: Mapping[str, float]) -> None:
    """Predicted against measured `figure`, log-log, each point named by its layout."""
    found, label = pairs(runs, figure), COMPARED[figure][1]
    measured, predicted = sides(found)
    ax.scatter(measured, predicted)
    low, high = min(measured + predicted) * 0.8, max(measured + predicted) * 1.25
    for run, x, y in found:
        # Labels of points in the right part of the panel go to their left: inside the figure.
        left = math.log(x / low) / math.log(high / low) > 0.6
        ax.annotate(run.data.tags.get("parallel", ""), (x, y), fontsize=8,
                    xytext=(-4 if left else 4, 4), textcoords="offset points",
                    ha="right" if left else "left")  # fmt: skip
    ax.plot([low, high], [low, high], color="grey", linestyle="--", label="predicted = measured")
    ax.set(xscale="log", yscale="log", xlim=(low, high), ylim=(low, high))
    ax.set_xlabel(f"measured {label}")
    ax.set_ylabel(f"predicted {label}")
    ax.set_title(title(figure, len(found), result))
    ax.legend(loc="upper left")


def picture(runs: list[MlflowRun], result: Mapping[str, float]) -> Figure:
    shown = compared(runs)
    fig = Figure(figsize=(7 * len(shown), 6))
    for i, figure in enumerate(shown, start=1):
        panel(fig.add_subplot(1, len(shown), i), runs, figure, result)
    fig.tight_layout()
    return fig


def run(
    cfg: DictConfig, job: Job | None, choices: Mapping[str, str | None], overrides: list[str]
) -> dict[str, Any]:
    from runner.tracking.job_run import recorded_run

    client = client_of(cfg.logger.tracking_uri)
    sweep, runs = sweep_runs(client, cfg)
    result = summary(runs)
    name = client.get_run(sweep).info.run_name
    text = f"report of sweep {sweep} ({name}): {len(runs)} trained runs\n\n" + table(runs, result)
    with recorded_run(cfg, choices, overrides) as record:
        record.log_metrics(result)
        record.client.set_tag(record.run_id, "report.sweep", sweep)
        record.client.log_text(record.run_id, text, "report.txt")
        record.client.log_figure(record.run_id, picture(runs, result), "predicted_vs_measured.png")
    print(text)
    return result
