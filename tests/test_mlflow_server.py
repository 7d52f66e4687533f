"""A run logged over HTTP to a real `mlflow server` on 127.0.0.1."""

from collections.abc import Iterator
from pathlib import Path

import pytest
from mlflow import MlflowClient

from runner.metrics import EXAMPLE_Y_HAT
from tests.helpers.in_process import Cli
from tests.helpers.records import all_runs
from tests.helpers.servers import mlflow_serving


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    with mlflow_serving("server", f"sqlite:///{tmp_path / 'server.db'}", cwd=tmp_path) as url:
        yield url


@pytest.mark.slow
def test_a_run_is_logged_to_a_server_over_http(server: str, tmp_path: Path, cli: Cli) -> None:
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    done = cli("+experiment=seed_neuron", f"logger.tracking_uri={server}", cwd=job_dir)
    assert done.returncode == 0, done.stderr
    assert not (job_dir / "mlflow.db").exists()  # nothing went to the local default
    assert f"  see it: {server}/#/experiments/" in done.stderr  # the server's own page
    (run,) = all_runs(server)
    assert run.info.status == "FINISHED"
    assert round(run.data.metrics[EXAMPLE_Y_HAT.name], 3) == 0.992
    artifacts = {a.path for a in MlflowClient(server).list_artifacts(run.info.run_id)}
    assert artifacts == {"config.yaml", "overrides.yaml"}
