"""What a person sees: `mlflow ui` on a sweep's store, opened in headless Chromium (Debian's
`chromium`, driven by Playwright), at the page the sweep's summary prints. The checks read the
rendered page: the parent's row opens onto its jobs, the parent of a study (experiments/) shows its
question as description, its answer (report.md) and a chart per figure in its Artifacts, its
comparison each job's figures, and a job's `train_loss` chart draws one point per step."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from mlflow import MlflowClient

from runner.metrics import TRAIN_LOSS
from tests.helpers.in_process import Cli
from tests.helpers.jobs import QUICK
from tests.helpers.records import all_runs
from tests.helpers.servers import mlflow_starting

BROWSER = shutil.which("chromium")
STEPS = 6
# As root, on a machine with no network beyond this one: no sandbox, no background connections.
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SHOWN_S = 60  # the longest a page may take to show what is asked (the UI loads in seconds)

pytestmark = pytest.mark.slow


@pytest.fixture
def page() -> Iterator:
    """A page of a headless Chromium."""
    if BROWSER is None:
        pytest.skip("no chromium on this machine (Debian: apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=BROWSER, args=FLAGS)
        try:
            shown = browser.new_page(viewport={"width": 1400, "height": 900})
            shown.set_default_timeout(SHOWN_S * 1000)
            yield shown
        finally:
            browser.close()


def test_the_ui_shows_a_studys_answer_its_comparison_and_a_jobs_loss_chart(
    page,
    tmp_path: Path,
    cli: Cli,
    seeded: str,
) -> None:
    # The study's two jobs on a small model, priced by its profile: what the UI shows of a study
    # does not depend on its size (as shipped, 1.5 to 2 s a step), nor on what priced it.
    study = ["+experiment=bubble", "parallel.schedule=gpipe", "parallel.microbatches=2,4"]
    small = ["model.hidden=[64,64,64]", "data.batch_size=64", "hardware.figures=profile"]
    store = seeded
    # The server starts (seconds) while the study runs: it reads the store as runs arrive.
    with mlflow_starting("ui", store, cwd=tmp_path) as (url, answering):
        done = cli("-m", *study, *small, f"trainer.max_steps={STEPS}", *QUICK, cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
        said = done.stderr.splitlines()
        opened = [line for line in said if line.startswith("  then open http://127.0.0.1:5000")]
        shown_at = opened[-1].removeprefix("  then open http://127.0.0.1:5000")
        assert shown_at.startswith("/#/experiments/"), done.stderr[-500:]
        runs = all_runs(store)
        (parent,) = [r for r in runs if r.data.tags.get("mode") == "sweep"]
        jobs = sorted((r for r in runs if r is not parent), key=lambda r: r.info.start_time)
        answering()
        # The experiment's runs, the sweep's parent on a row of its own; opened, its jobs.
        page.goto(url + shown_at)
        page.get_by_text(parent.info.run_name, exact=True).wait_for()
        assert all(page.get_by_text(j.info.run_name).count() == 0 for j in jobs)
        page.locator('button[data-component-id*="runnamecellrenderer"]').first.click()
        for job in jobs:
            page.get_by_text(job.info.run_name, exact=True).wait_for()
        # The study's parent: its question as the Overview's description
        run_page = f"{url}/#/experiments/{parent.info.experiment_id}/runs/{parent.info.run_id}"
        page.goto(f"{run_page}?workflowType=machine_learning")
        question = parent.data.tags["mlflow.note.content"]
        assert question.startswith("How does the pipeline bubble fall")
        page.get_by_text(question).first.wait_for()
        # Its Artifacts: the answer in report.md, rendered, as the terminal printed it
        page.goto(f"{run_page}/artifacts?workflowType=machine_learning")
        page.get_by_text("report.md").click()
        start = max(i for i, line in enumerate(said) if line.startswith("answer: "))
        answer = " ".join(line.strip() for line in said[start:]).removeprefix("answer: ")
        page.get_by_role("heading", name="Answer").wait_for()
        page.get_by_text(answer[:60]).first.wait_for()
        # ... and a chart per figure, in charts/
        page.get_by_text("charts", exact=True).click()
        page.get_by_text("bubble_fraction_measured.png").click()
        chart = page.get_by_alt_text("bubble_fraction_measured.png")
        chart.wait_for()
        assert chart.evaluate("img => img.complete && img.naturalWidth") >= 600
        # The comparison, a row per job with its final loss
        page.get_by_text("comparison.md").click()
        rows = page.get_by_role("row").filter(has=page.get_by_role("cell"))  # rendered as a table
        rows.nth(len(jobs) - 1).wait_for()
        cells = [row.get_by_role("cell").all_inner_texts() for row in rows.all()]
        by_number = {row[0]: row for row in cells}  # #N: the N-th job to start
        for number, job in enumerate(jobs, 1):
            losses = MlflowClient(store).get_metric_history(job.info.run_id, TRAIN_LOSS.name)
            final = max(losses, key=lambda m: m.step).value
            assert by_number[str(number)][2:4] == ["FINISHED", f"{final:.4f}"], cells
        # A job's train_loss chart: one point per step.
        job = jobs[0]
        page.goto(f"{url}/#/experiments/{job.info.experiment_id}/runs/{job.info.run_id}"
                  "/model-metrics?workflowType=machine_learning")  # fmt: skip
        page.get_by_placeholder("Search metric charts").fill(TRAIN_LOSS.name)
        card = page.locator('[data-testid="experiment-view-compare-runs-card"]')
        card.get_by_text(TRAIN_LOSS.name, exact=True).wait_for()
        points = card.locator(".js-plotly-plot .scatterlayer .point")
        points.nth(STEPS - 1).wait_for()
        assert points.count() == STEPS
