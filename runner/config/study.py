"""A study's own block (`study:` in an experiments/ file): the question it asks, what is expected,
and what answers it: the swept key on the x-axis, the figures compared, and the line each is held
against. The grid itself stays Hydra's (`hydra.sweeper.params`); runner/studies/report.py writes the
answer on the sweep's parent run. And its rules: every name is a key of the config or a metric the
runner logs, so a misspelt study fails before anything runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf

from runner.errors import one_of, require
from runner.metrics import registered
from runner.studies.lines import FORMULAS


@dataclass
class StudyConfig:
    question: str = ""  # in words: what the study asks (the parent run's description)
    expects: str = ""  # what the seed or the literature expects, and why
    x: str | None = None  # the swept key on the charts' x-axis, e.g. parallel.microbatches
    lines: list[str] = field(default_factory=list)  # other swept keys: a line per value
    # Swept keys a point is the mean over (where a fault strikes): their jobs repeat one point
    repeats: list[str] = field(default_factory=list)
    # Metrics of runner/metrics.py (docs/measurement.md): a table column and a chart each
    figures: list[str] = field(default_factory=list)
    # figure -> the line to hold it against: a metric of the same run (pred/step_time_s,
    # bubble_fraction_theory) or a formula of runner/studies/lines.py (ideal_scaling, same)
    predicted: dict[str, str] = field(default_factory=dict)
    # "lowest cost_usd" or "highest mfu": the answer names the job that does best by one figure
    best: str | None = None
    # A figure of study.figures on which two lines cross (one replica's step time and two's):
    # the answer says at which x they tie, measured and as predicted
    crossover: str | None = None
    # How each job ends: FINISHED; FAILED where the study injects a fault on purpose (fault.*):
    # the failure is the measurement, so the sweep goes on to its next job and counts this one.
    ends: str = "FINISHED"


BEST = ("lowest", "highest")
ENDS = ("FINISHED", "FAILED")
FAULTS = ("kill_rank", "hang_rank", "disk_full_at_step")  # what fails a job on purpose


def check_study(study: Any, cfg: DictConfig) -> None:
    if study is None:
        return
    require(bool(study.question), "study.question", "say in words what the study asks")
    missing = object()
    named = [("study.x", study.x), *(("study.lines", k) for k in study.lines)]
    for key, name in named + [("study.repeats", k) for k in study.repeats]:
        if name is not None:
            found = OmegaConf.select(cfg, name, default=missing, throw_on_missing=False)
            require(found is not missing, key, f"'{name}' is no key of the config")
    for figure in study.figures:
        require(
            registered(figure) is not None,
            "study.figures",
            f"'{figure}' is no metric the runner logs (runner/metrics.py, docs/measurement.md)",
        )
    if study.best is not None:
        how, _, figure = study.best.partition(" ")
        require(
            how in BEST and figure in study.figures,
            "study.best",
            f"'{study.best}': 'lowest' or 'highest', then one of study.figures",
        )
    if study.crossover is not None:
        require(
            study.crossover in study.figures and len(study.lines) == 1,
            "study.crossover",
            f"'{study.crossover}': one of study.figures, with one key in study.lines",
        )
    one_of(study.ends, "study.ends", ENDS)
    require(
        study.ends != "FAILED" or any(cfg.fault[f] is not None for f in FAULTS),
        "study.ends",
        "FAILED needs a fault that fails each job: " + ", ".join(f"fault.{f}" for f in FAULTS),
    )
    for figure, line in study.predicted.items():
        require(
            figure in study.figures,
            "study.predicted",
            f"'{figure}' is not one of study.figures: {', '.join(study.figures)}",
        )
        require(
            registered(line) is not None or line in FORMULAS,
            f"study.predicted.{figure}",
            f"'{line}' is neither a metric the runner logs nor a formula: " + ", ".join(FORMULAS),
        )
