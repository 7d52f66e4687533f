"""Shared fixtures: configs composed in-process, a fresh MLflow store per test, the CLI."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from mlflow import MlflowClient
from omegaconf import DictConfig, open_dict

from runner.cli import CONF_DIR
from runner.cluster import free_port  # noqa: F401 (the tests' import of it)
from runner.config import register_configs

register_configs()

# Small, quick settings for tests that train: the defaults are sized for a one-minute demo.
QUICK = ["trainer.progress_bar=false", "trainer.warmup_steps=2", "trainer.val_every_n_steps=10"]


REPOSITORY = Path(__file__).resolve().parent.parent


def copy_of_the_repository(dest: Path) -> Path:
    """The code and the configs, for commands that write into the repository (mode=calibrate's
    profile, a recipe's new files) or must run the code as a document shows it."""
    for part in ("runner", "plugins", "hydra_plugins", "benchmarks"):
        if (REPOSITORY / part).exists():
            shutil.copytree(REPOSITORY / part, dest / part, symlinks=True)
    return dest


def compose_job(*overrides: str) -> tuple[DictConfig, dict[str, str | None]]:
    """The job config and the group choices, as Hydra hands them to a job."""
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("config", overrides=list(overrides), return_hydra_config=True)
    choices = dict(cfg.hydra.runtime.choices)
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg, choices


@pytest.fixture(scope="session")
def empty_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An MLflow SQLite store with its tables made once: creating them costs seconds."""
    path = tmp_path_factory.mktemp("template") / "mlflow.db"
    MlflowClient(f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture
def store(tmp_path: Path, empty_store: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh store in a fresh working directory, reached through MLFLOW_TRACKING_URI.

    The URI is absolute: MLflow caches one database engine per URI string in a process.
    """
    shutil.copy(empty_store, tmp_path / "mlflow.db")
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


@pytest.fixture
def cli_here(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> Callable[..., subprocess.CompletedProcess]:
    """`python -m runner ARGS` run by this process, for input refused before anything starts: the
    same entry point (runner.cli.main), exit code and output, without seconds of imports a case."""
    from hydra.core.global_hydra import GlobalHydra

    from runner.cli import main

    def run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
        monkeypatch.chdir(cwd)
        monkeypatch.setattr(sys, "argv", ["runner", *args])
        monkeypatch.setenv("HYDRA_FULL_ERROR", "0")  # main sets it: restored after the test
        monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
        capfd.readouterr()
        handlers = logging_handlers()
        try:
            main()
            code = 0
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else 1
        finally:
            GlobalHydra.instance().clear()
            restore_logging_handlers(handlers)
        out, err = capfd.readouterr()
        return subprocess.CompletedProcess(["runner", *args], code, out, err)

    return run


def logging_handlers() -> dict[logging.Logger, list[logging.Handler]]:
    loggers = [logging.getLogger(name) for name in list(logging.Logger.manager.loggerDict)]
    return {log: log.handlers[:] for log in [logging.getLogger(), *loggers]}


def restore_logging_handlers(saved: dict[logging.Logger, list[logging.Handler]]) -> None:
    """Hydra's job logging binds handlers to this test's captured stderr, closed once it ends:
    a later test logging through them prints "I/O operation on closed file"."""
    for log in logging_handlers():
        log.handlers[:] = saved.get(log, [])


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


def all_runs(tracking_uri: str) -> list:
    client = MlflowClient(tracking_uri)
    experiments = [e.experiment_id for e in client.search_experiments()]
    return client.search_runs(experiments) if experiments else []


def train(*overrides: str) -> str:
    """Run one training job in-process, as the CLI would; return its MLflow run id."""
    from runner.app import run_job

    cfg, choices = compose_job(*QUICK, *overrides)
    before = {r.info.run_id for r in all_runs(cfg.logger.tracking_uri)}
    run_job(cfg, choices, list(overrides))
    (new,) = {r.info.run_id for r in all_runs(cfg.logger.tracking_uri)} - before
    return new


def loss_series(tracking_uri: str, run_id: str, key: str = "train_loss") -> list[float]:
    history = MlflowClient(tracking_uri).get_metric_history(run_id, key)
    return [m.value for m in sorted(history, key=lambda m: m.step)]


def losses_by_step(tracking_uri: str, run_id: str) -> list[float]:
    """The loss of every step; a step redone after a resume counts once (its last value)."""
    return [values[-1] for values in logged_per_step(tracking_uri, run_id).values()]


def logged_per_step(tracking_uri: str, run_id: str) -> dict[int, list[float]]:
    """Each step's losses in the order they were logged: a step redone after a resume has two."""
    history = MlflowClient(tracking_uri).get_metric_history(run_id, "train_loss")
    by_step: dict[int, list[float]] = {}
    for m in sorted(history, key=lambda m: (m.step, m.timestamp)):
        by_step.setdefault(m.step, []).append(m.value)
    return by_step


RESUME_RELATIVE = 1e-6  # a resumed run repeats the same arithmetic: the bound


def assert_redone_steps_repeat(tracking_uri: str, run_id: str, redone: range) -> None:
    """The steps a resume redid gave the losses the run had logged for them the first time."""
    per_step = logged_per_step(tracking_uri, run_id)
    assert {s for s, values in per_step.items() if len(values) == 2} == set(redone), per_step
    first, again = zip(*(per_step[s] for s in redone), strict=True)
    assert list(again) == pytest.approx(list(first), rel=RESUME_RELATIVE)


def forget_snapshots_of_step(root: Path, step: int) -> None:
    """Remove every run's snapshot of that step under root, as if the jobs had stopped before."""
    for folder in root.glob(f"**/step_{step:08d}"):
        shutil.rmtree(folder)


SERVER_START_S = 180  # an MLflow server answers after about 25 s here; CI may be slower


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
def mlflow_serving(command: str, store: str, cwd: Path) -> Iterator[str]:
    """`mlflow server` or `mlflow ui` on the store, on 127.0.0.1: its URL once it answers."""
    port = free_port()
    args = ["--host", "127.0.0.1", "--port", str(port), "--backend-store-uri", store]
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", command, *args, "--workers", "1"],
        cwd=cwd,
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
