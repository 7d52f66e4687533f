"""mode=report: how far to trust the planner. A sweep's runs, each figure predicted next to
measured: a table, a picture, the error per figure, and whether the planner ranks the layouts in
the order the measurements do (Spearman's rank correlation of step time).
"""

from __future__ import annotations

from collections.abc import Mapping
from statistics import median
from typing import Any

from matplotlib.figure import Figure
from mlflow import MlflowClient
from mlflow.entities import Run as MlflowRun
from omegaconf import DictConfig
from scipy.stats import spearmanr

from runner.errors import ConfigError
from runner.job import Job
from runner.tracking import experiment_id

# measured metric -> its prediction
FIGURES = {
    "step_time_s": "pred/step_time_s",
    "idle_fraction": "pred/idle_fraction",
    "bubble_fraction_measured": "bubble_fraction_theory",
    "comm_bytes_per_step/dp": "pred/comm_bytes_per_step/dp",
    "comm_bytes_per_step/tp": "pred/comm_bytes_per_step/tp",
    "comm_bytes_per_step/pp": "pred/comm_bytes_per_step/pp",
}


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
        and {"step_time_s", "pred/step_time_s"} <= r.data.metrics.keys()
    ]
    return sorted(trained, key=lambda r: r.info.start_time), runs


def errors(runs: list[MlflowRun]) -> dict[str, list[float]]:
    """Relative error (predicted - measured) / measured of every figure a run has both of."""
    out: dict[str, list[float]] = {}
    for run in runs:
        m = run.data.metrics
        for measured, predicted in FIGURES.items():
            if measured in m and predicted in m and m[measured]:
                out.setdefault(measured, []).append((m[predicted] - m[measured]) / m[measured])
    return out


def summary(runs: list[MlflowRun]) -> dict[str, float]:
    found = errors(runs)
    out = {f"median_abs_error/{k}": median(abs(e) for e in v) for k, v in found.items()}
    measured = [r.data.metrics["step_time_s"] for r in runs]
    predicted = [r.data.metrics["pred/step_time_s"] for r in runs]
    out["spearman/step_time_s"] = float(spearmanr(predicted, measured).statistic)
    out["runs"] = float(len(runs))
    return out


def table(runs: list[MlflowRun], result: Mapping[str, float]) -> str:
    lines = [f"{'run':<48} {'step s measured':>15} {'predicted':>10} {'error':>8}"]
    for run in runs:
        m = run.data.metrics
        meas, pred = m["step_time_s"], m["pred/step_time_s"]
        lines.append(
            f"{run.info.run_name[:48]:<48} {meas:>15.4f} {pred:>10.4f} {pred / meas - 1:>+8.1%}"
        )
    lines.append("")
    lines += [f"{k}: {v:.3f}" for k, v in result.items()]
    return "\n".join(lines)


def picture(runs: list[MlflowRun], result: Mapping[str, float]) -> Figure:
    fig = Figure(figsize=(7, 6))
    ax = fig.add_subplot()
    measured = [r.data.metrics["step_time_s"] for r in runs]
    predicted = [r.data.metrics["pred/step_time_s"] for r in runs]
    ax.scatter(measured, predicted)
    for run, x, y in zip(runs, measured, predicted, strict=True):
        ax.annotate(run.data.tags.get("parallel", ""), (x, y), fontsize=8, xytext=(4, 4),
                    textcoords="offset points")  # fmt: skip
    low, high = min(measured + predicted) * 0.8, max(measured + predicted) * 1.25
    ax.plot([low, high], [low, high], color="grey", linestyle="--", label="predicted = measured")
    ax.set(xscale="log", yscale="log", xlim=(low, high), ylim=(low, high))
    ax.set_xlabel("measured step time (s)")
    ax.set_ylabel("predicted step time (s)")
    ax.set_title(
        f"median |error| {result['median_abs_error/step_time_s']:.0%}, "
        f"Spearman {result['spearman/step_time_s']:.2f}, {len(runs)} runs"
    )
    ax.legend(loc="upper left")
    fig.tight_layout()
    return fig


def run(
    cfg: DictConfig, job: Job | None, choices: Mapping[str, str | None], overrides: list[str]
) -> dict[str, Any]:
    from runner.tracking import recorded_run

    client = MlflowClient(cfg.logger.tracking_uri)
    sweep, runs = sweep_runs(client, cfg)
    result = summary(runs)
    text = table(runs, result)
    with recorded_run(cfg, choices, overrides) as record:
        record.log_metrics(result)
        record.client.set_tag(record.run_id, "report.sweep", sweep)
        record.client.log_text(record.run_id, text, "report.txt")
        record.client.log_figure(record.run_id, picture(runs, result), "predicted_vs_measured.png")
    print(text)
    return result
