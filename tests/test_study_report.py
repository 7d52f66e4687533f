"""A study's answer on its sweep's parent run (runner/studies/report.py), from jobs whose figures
are known: the paragraph's numbers are the runs', a prediction is held against each, and the jobs
that failed or do not fit are named, in the table, the charts and the terminal's last lines."""

from __future__ import annotations

from pathlib import Path

import pytest
from matplotlib.image import imread
from mlflow import MlflowClient
from omegaconf import OmegaConf

from runner.config.study import StudyConfig
from runner.metrics import BUBBLE_MEASURED, BUBBLE_THEORY, LOST_STEPS, PLAN_FITS, THROUGHPUT
from runner.studies.report import shown_in, tie, trend
from runner.tracking.store import NESTED_TAG
from runner.tracking.sweep_run import end_parent, start_parent

STUDY = StudyConfig(
    question="How does the bubble fall with micro-batches?",
    expects="(p - 1) / (m + p - 1)",
    x="parallel.microbatches",
    lines=["parallel.schedule"],
    figures=[BUBBLE_MEASURED.name, THROUGHPUT.name],
    predicted={BUBBLE_MEASURED.name: BUBBLE_THEORY.name, THROUGHPUT.name: "ideal_scaling"},
)
# (micro-batches, status, measured bubble, theory, samples/s, fits)
JOBS = [
    (2, "FINISHED", 0.40, 1 / 3, 100.0, None),
    (4, "FINISHED", 0.25, 1 / 5, 150.0, None),
    (8, "FINISHED", 0.15, 1 / 9, 200.0, None),
    (16, "FAILED", None, 1 / 17, None, None),
    (32, "FINISHED", 0.01, 1 / 33, 900.0, 0.0),
]


def test_the_answer_table_and_charts_are_the_jobs_own_numbers(
    seeded: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    parent = start_parent(seeded, "studies", "sweep: bubble", OmegaConf.structured(STUDY))
    client = MlflowClient(seeded)
    experiment = client.get_experiment_by_name("studies").experiment_id
    for m, status, bubble, theory, samples, fits in JOBS:
        run = client.create_run(experiment, tags={NESTED_TAG: parent.run_id}).info.run_id
        client.log_param(run, "parallel.microbatches", m)
        client.log_param(run, "parallel.schedule", "gpipe")
        figures = {
            BUBBLE_MEASURED.name: bubble,
            BUBBLE_THEORY.name: theory,
            THROUGHPUT.name: samples,
        }
        figures |= {PLAN_FITS.name: fits}
        for key, value in figures.items():
            if value is not None:
                client.log_metric(run, key, value)
        client.set_terminated(run, status)
    end_parent("FINISHED")
    printed = capsys.readouterr().err.splitlines()

    said = (
        "bubble_fraction_measured, as parallel.microbatches goes 2 → 8: schedule=gpipe falls from"
        " 40% to 15%; bubble_fraction_theory within 6.67 pts at every point, its ranking of the"
        " points against the measured one: Spearman 1.00."
        " throughput_samples_per_s, as parallel.microbatches goes 2 → 8: schedule=gpipe rises"
        " from 100 samples/s to 200 samples/s; ideal_scaling within 200 samples/s at every point,"
        " at most 100% off, its ranking of the points against the measured one: Spearman 1.00."
        " 1 of 5 jobs do not fit: #5 (parallel.microbatches=32 schedule=gpipe)."
        " 1 of 5 jobs ended FAILED: #4 (parallel.microbatches=16 schedule=gpipe)."
    )
    run = client.get_run(parent.run_id)
    assert run.data.tags["mlflow.note.content"] == STUDY.question
    report = Path(client.download_artifacts(parent.run_id, "report.md")).read_text()
    assert report.startswith(f"# {STUDY.question}\n\nExpected: {STUDY.expects}\n")
    assert f"## Answer\n\n{said}\n" in report
    rows = [line for line in report.splitlines() if line.startswith("| #")]
    assert rows[0] == ("| #1 | 2 | gpipe | FINISHED | - | 40 | 33.3 | +6.67 | 100 | 100 | +0 |")
    assert rows[3].startswith("| #4 | 16 | gpipe | FAILED | - | - | 5.88 | - |")
    assert rows[4].startswith("| #5 | 32 | gpipe | FINISHED | **no** | 1 |")
    charts = {a.path for a in client.list_artifacts(parent.run_id, "charts")}
    assert charts == {"charts/bubble_fraction_measured.png", "charts/throughput_samples_per_s.png"}
    picture = imread(
        client.download_artifacts(parent.run_id, "charts/bubble_fraction_measured.png")
    )
    assert picture.shape[0] > 300 and picture.shape[1] > 500
    # The terminal's summary ends with the same paragraph
    start = next(i for i, line in enumerate(printed) if line.startswith("answer: "))
    assert " ".join(line.strip() for line in printed[start:]) == f"answer: {said}"


def test_failures_on_purpose_count_and_repeats_are_averaged(
    seeded: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The snapshots study's answer: each job killed on purpose (study.ends), a point per interval
    the mean over where the kill struck (study.repeats); the one job that finished is the flaw."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    study = StudyConfig(question="q", x="checkpoint.every_n_steps", repeats=["fault.at_step"],
                        figures=[LOST_STEPS.name], predicted={LOST_STEPS.name: "half_interval"},
                        ends="FAILED")  # fmt: skip
    parent = start_parent(seeded, "studies", "sweep: snapshots", OmegaConf.structured(study))
    client = MlflowClient(seeded)
    experiment = client.get_experiment_by_name("studies").experiment_id
    for every, at, status in [(2, 4, "FAILED"), (2, 5, "FAILED"), (4, 5, "FAILED"),
                              (4, 6, "FAILED"), (4, 7, "FINISHED")]:  # fmt: skip
        run = client.create_run(experiment, tags={NESTED_TAG: parent.run_id}).info.run_id
        client.log_param(run, "checkpoint.every_n_steps", every)
        client.log_param(run, "fault.at_step", at)
        client.log_metric(run, LOST_STEPS.name, at % every)
        client.set_terminated(run, status)
    end_parent("FINISHED", summary=False)
    report = Path(client.download_artifacts(parent.run_id, "report.md")).read_text()
    assert (
        "lost_steps, as checkpoint.every_n_steps goes 2 → 4: rises from 0.5 to 1.5;"
        " half_interval within 0.5 at every point."  # (0 + 1) / 2 against 1, (1 + 2) / 2 against 2
        " 1 of 5 jobs ended FINISHED: #5 (checkpoint.every_n_steps=4)." in report
    )
    assert "| #2 | 2 | 5 | FAILED | 1 | 1 | +0 |" in report


def test_two_lines_tie_where_their_ratio_crosses_one_on_log_scales() -> None:
    # One replica's step 10 then 30 ms, two's 15 then 20 ms, at batches 2 and 8: the ratio goes
    # 1.5 -> 2/3, symmetric on a log scale, so the tie is halfway on log x: sqrt(2 * 8) = 4.
    assert tie([(2, 10.0, 15.0), (8, 30.0, 20.0)]) == pytest.approx(4.0)
    # The first crossing; a tie at a point is that point; no change of side, no tie.
    assert tie([(1, 1.0, 1.0), (2, 1.0, 3.0)]) == 1
    # ratio 2 then 1/4: log 2 and -2 log 2, a third of the way: 2 ** (1/3)
    assert tie([(1, 1.0, 2.0), (2, 4.0, 1.0), (4, 1.0, 4.0)]) == pytest.approx(2 ** (1 / 3))
    assert tie([(1, 1.0, 2.0), (2, 1.0, 3.0)]) is None


def test_a_line_that_turns_says_where() -> None:
    """The bubble study's samples/s on a slow host: more micro-batches help up to m = 4, then each
    one's own cost outweighs the bubble it removes; the answer names the turn, not just the ends."""
    x, values = "parallel.microbatches", [486.0, 629.0, 558.0]
    shown = shown_in(THROUGHPUT.name, values)
    points = list(zip(("2", "4", "8"), values, strict=True))
    assert trend(points, x, shown) == (
        "rises from 486 samples/s to 629 samples/s at parallel.microbatches=4,"
        " then falls to 558 samples/s"
    )
    # A flat step is no turn; a line that only falls says its ends, as before.
    flat = [("1", 3.0), ("2", 5.0), ("4", 5.0), ("8", 2.0), ("16", 1.0)]
    assert trend(flat, "x", shown_in(LOST_STEPS.name, [p for _, p in flat])) == (
        "rises from 3 to 5 at x=2, then falls to 1"
    )
    assert trend(points[1:], x, shown) == "falls from 629 samples/s to 558 samples/s"
