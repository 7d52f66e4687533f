"""A study of experiments/ run shortened, and what every study's answer must be whatever it asks:
the parent's description is its question, report.md's answer is the terminal's last paragraph,
a chart per figure, a row per job with the job's own status, and each prediction's gap the
largest the runs themselves show."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml
from mlflow import MlflowClient
from mlflow.entities import Run

from runner.config_dirs import EXPERIMENTS_DIR
from runner.studies.lines import FORMULAS
from runner.studies.report import chart_name, shown_in
from tests.helpers.in_process import Cli
from tests.helpers.records import all_runs

SHORT = [
    "trainer.max_steps=3",
    "trainer.warmup_steps=1",
    "trainer.val_batches=0",
    "trainer.progress_bar=false",
]


@dataclass
class Answered:
    study: dict
    parent: Run
    jobs: list[Run]  # in the order they ran: #1, #2, ...
    report: str
    said: str  # the answer paragraph

    def row(self, number: int) -> list[str]:
        """Job #N's cells in report.md's table."""
        (line,) = [ln for ln in self.report.splitlines() if ln.startswith(f"| #{number} |")]
        return [cell.strip() for cell in line.strip("|").split("|")]

    def metric(self, key: str) -> list[float | None]:
        return [job.data.metrics.get(key) for job in self.jobs]


def run_study(cli: Cli, here: Path, uri: str, name: str, *overrides: str) -> Answered:
    done = cli("-m", f"+experiment={name}", *overrides, cwd=here)
    assert done.returncode == 0, done.stderr[-3000:]
    study = yaml.safe_load((EXPERIMENTS_DIR / f"{name}.yaml").read_text())["study"]
    study.setdefault("lines", [])
    study.setdefault("predicted", {})
    runs = all_runs(uri)
    (parent,) = [r for r in runs if r.data.tags.get("mode") == "sweep"]
    jobs = sorted((r for r in runs if r is not parent), key=lambda r: r.info.start_time)
    client = MlflowClient(uri)
    report = Path(client.download_artifacts(parent.info.run_id, "report.md")).read_text()
    printed = done.stderr.splitlines()
    start = max(i for i, line in enumerate(printed) if line.startswith("answer: "))
    said = " ".join(line.strip() for line in printed[start:]).removeprefix("answer: ")
    answered = Answered(study, parent, jobs, report, said)
    assert_answered(answered, client)
    return answered


def assert_answered(a: Answered, client: MlflowClient) -> None:
    assert a.parent.data.tags["mlflow.note.content"] == " ".join(a.study["question"].split())
    assert f"## Answer\n\n{a.said}\n" in a.report
    charts = {f.path for f in client.list_artifacts(a.parent.info.run_id, "charts")}
    assert charts == {f"charts/{chart_name(f)}" for f in a.study["figures"]}
    # the cells before it: job, x, the lines' keys, the keys a point is the mean over
    status = 1 + 1 + len(a.study["lines"]) + len(a.study.get("repeats", []))
    for number, job in enumerate(a.jobs, 1):
        assert a.row(number)[status] == job.info.status
    for figure, line in a.study["predicted"].items():
        if line in FORMULAS:
            continue
        pairs = [
            (got, guess)
            for got, guess in zip(a.metric(figure), a.metric(line), strict=True)
            if got is not None and guess is not None
        ]
        if pairs:
            gap = max(abs(got - guess) for got, guess in pairs)
            shown = shown_in(figure, a.metric(figure))
            close = "exactly" if gap == 0 else f"within {shown.gap(gap, signed=False)}"
            assert f"{line} {close}" in a.said, (figure, close, a.said)


def named(said: str, verdict: str) -> set[int]:
    """The jobs' numbers the answer names after "jobs do not fit:" (or another verdict)."""
    found = re.search(rf"jobs {verdict}: (.*?)\.(?: |$)", said)
    return {int(n) for n in re.findall(r"#(\d+)", found.group(1))} if found else set()
