"""A run logged over HTTP to a real `mlflow server` on 127.0.0.1."""

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from mlflow import MlflowClient

from tests.conftest import all_runs, free_port, run_cli

SERVER_START_S = 180  # it answers after about 25 s on this machine; CI may be slower


def wait_healthy(url: str, server: subprocess.Popen) -> None:
    deadline = time.monotonic() + SERVER_START_S
    while time.monotonic() < deadline:
        assert server.poll() is None, "mlflow server exited before answering"
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            time.sleep(0.5)  # polling interval for the health endpoint, not a wait for a result
    raise TimeoutError(f"mlflow server did not answer at {url} within {SERVER_START_S} s")


@pytest.fixture
def server(tmp_path: Path):
    port = free_port()
    mlflow_cli = [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    store = ["--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}"]
    proc = subprocess.Popen(
        [*mlflow_cli, *store, "--workers", "1"],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # one process group: the server and its workers end together
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


@pytest.mark.slow
def test_a_run_is_logged_to_a_server_over_http(server: str, tmp_path: Path) -> None:
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    done = run_cli("+experiment=seed_neuron", f"logger.tracking_uri={server}", cwd=job_dir)
    assert done.returncode == 0, done.stderr
    assert not (job_dir / "mlflow.db").exists()  # nothing went to the local default
    (run,) = all_runs(server)
    assert run.info.status == "FINISHED"
    assert round(run.data.metrics["y_hat"], 3) == 0.992
    artifacts = {a.path for a in MlflowClient(server).list_artifacts(run.info.run_id)}
    assert artifacts == {"config.yaml", "overrides.yaml"}
