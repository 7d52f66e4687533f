"""`python -m runner` as a process of its own, in a session of its own, as a user starts it: for
what only a process shows (its signals, its exit, what it leaves behind). Everything else runs
the command line in the test's own process (tests/helpers/in_process.py): the same entry point
without seconds of imports a run."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path


def start_cli(*args: str, cwd: Path) -> subprocess.Popen:
    """`python -m runner ARGS` in cwd, as a user types it, in a session of its own."""
    return start_session([sys.executable, "-m", "runner", *args], cwd)


def start_session(argv: list[str], cwd: Path) -> subprocess.Popen:
    """A command in cwd, in a session of its own, without this process's store or tracebacks."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "HYDRA_FULL_ERROR")
    }
    return subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


@contextlib.contextmanager
def cli_job(*args: str, cwd: Path) -> Iterator[subprocess.Popen]:
    """A running `python -m runner ARGS`; whatever is left of it is killed at the end."""
    job = start_cli(*args, cwd=cwd)
    try:
        yield job
    finally:
        stop_session(job)


def run_cli(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    with cli_job(*args, cwd=cwd) as job:
        stdout, stderr = job.communicate(timeout=timeout)
    return subprocess.CompletedProcess(job.args, job.returncode, stdout, stderr)


def stop_session(job: subprocess.Popen) -> None:
    """Leave nothing behind: kill whatever of the job's session is still alive."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(job.pid, signal.SIGKILL)
    job.wait()


def session_processes(session: int) -> list[int]:
    """Processes still alive in a session (the launcher's and every rank it started)."""
    alive = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == session and fields[0] != "Z":
                alive.append(int(entry.name))
    return alive


def assert_session_ends(session: int, within: float = 10) -> None:
    """Every process of the job gone within seconds (the resource tracker leaves last)."""
    deadline = time.monotonic() + within
    while session_processes(session):
        assert time.monotonic() < deadline, f"still alive: {session_processes(session)}"
        time.sleep(0.1)  # polling interval of /proc


def logged_losses(db: Path) -> int:
    """Losses logged so far, read straight from SQLite: an MLflow client here would race the
    job's own creation of the tables."""
    if not db.exists():
        return 0
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
            return con.execute("SELECT COUNT(*) FROM metrics WHERE key = 'train_loss'").fetchone()[
                0
            ]
    except sqlite3.OperationalError:  # tables not made yet
        return 0


def wait_for_steps(db: Path, job: subprocess.Popen, steps: int, timeout: float = 120) -> None:
    """Block until the job has logged `steps` losses (polling the store), or fail."""
    deadline = time.monotonic() + timeout
    while logged_losses(db) < steps:
        assert job.poll() is None, job.communicate()[1][-3000:]
        assert time.monotonic() < deadline, f"the job did not log {steps} steps in {timeout} s"
        time.sleep(0.2)  # polling interval of the store, not a wait for the result
