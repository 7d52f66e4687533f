"""An MLflow server (or `mlflow ui`) on 127.0.0.1 for the tests that talk to one."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

from runner.launcher.cluster import free_port

SERVER_START_S = 180  # an MLflow server answers after about 25 s here; CI may be slower
# MLflow 3's server also starts job runners (huey consumers, for its GenAI evaluation jobs) that
# import MLflow again in three more processes: a twentieth of the whole suite's CPU on 2 cores,
# beside the other worker's tests. No test runs a job through them.
SERVER_ENV = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


def wait_healthy(url: str, server: subprocess.Popen) -> None:
    deadline = time.monotonic() + SERVER_START_S
    while time.monotonic() < deadline:
        assert server.poll() is None, "the MLflow server exited before answering"
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            time.sleep(0.5)  # polling interval for the health endpoint, not a wait for a result
    raise TimeoutError(f"the MLflow server did not answer at {url} within {SERVER_START_S} s")


@contextlib.contextmanager
def mlflow_starting(
    command: str, store: str, cwd: Path
) -> Iterator[tuple[str, Callable[[], None]]]:
    """`mlflow server` or `mlflow ui` on the store, on 127.0.0.1, started: its URL, and a call that
    waits until it answers. What the test does before that call overlaps the server's start-up
    (about 25 s here)."""
    port = free_port()
    args = ["--host", "127.0.0.1", "--port", str(port), "--backend-store-uri", store]
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", command, *args, "--workers", "1"],
        cwd=cwd,
        env=os.environ | SERVER_ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # one process group: the server and its workers end together
    )
    url = f"http://127.0.0.1:{port}"
    try:
        yield url, lambda: wait_healthy(url, proc)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


@contextlib.contextmanager
def mlflow_serving(command: str, store: str, cwd: Path) -> Iterator[str]:
    """`mlflow server` or `mlflow ui` on the store, on 127.0.0.1: its URL once it answers."""
    with mlflow_starting(command, store, cwd) as (url, answering):
        answering()
        yield url
