"""Several writers to one SQLite store (runner/tracking/store.py): runs and a sweep started at the
same moment against a store that does not exist yet all end FINISHED with every metric."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.metrics import THROUGHPUT
from tests.helpers.in_process import Cli
from tests.helpers.jobs import QUICK
from tests.helpers.processes import cli_job
from tests.helpers.records import all_runs, loss_series

STEPS = 6
JOB = ["model=neuron", f"trainer.max_steps={STEPS}", *QUICK]


@pytest.mark.slow
def test_runs_and_a_sweep_started_together_on_a_new_store_all_finish_with_every_metric(
    tmp_path: Path,
) -> None:
    with (
        cli_job(*JOB, "seed=1", cwd=tmp_path) as one,
        cli_job(*JOB, "seed=2", cwd=tmp_path) as two,
        cli_job("-m", *JOB, "seed=3,4", cwd=tmp_path) as sweep,
    ):
        ended = [(job.communicate(timeout=300)[1], job.returncode) for job in (one, two, sweep)]
    assert [code for _, code in ended] == [0, 0, 0], ended
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    runs = all_runs(store)
    trained = [r for r in runs if r.data.tags.get("mode") != "sweep"]
    assert sorted(r.data.params["seed"] for r in trained) == ["1", "2", "3", "4"]
    assert {r.info.status for r in runs} == {"FINISHED"} and len(runs) == 5  # the sweep's parent
    keys = [set(r.data.metrics) for r in trained]
    assert all(k == keys[0] for k in keys) and THROUGHPUT.name in keys[0]
    for run in trained:
        assert len(loss_series(store, run.info.run_id)) == STEPS


def test_a_runs_artifacts_stay_beside_its_store_wherever_it_runs(
    cli: Cli, tmp_path: Path, seeded: str
) -> None:
    # The store in the test's folder, the command run from another: MLflow's default put the
    # artifacts in ./mlruns of the folder it ran in (the suite filled the checkout's).
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = cli(*JOB, f"logger.tracking_uri={seeded}", cwd=elsewhere)
    assert done.returncode == 0, done.stderr[-2000:]
    (run,) = all_runs(seeded)
    assert run.info.artifact_uri.startswith((tmp_path / "mlruns").as_uri())
    assert (tmp_path / "mlruns").is_dir() and not (elsewhere / "mlruns").exists()
