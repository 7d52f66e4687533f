"""The suite's fixtures (shared helpers live in tests/helpers/): a fresh MLflow store per test,
the command line run by the test's own process, and the checkout left as the suite found it."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from mlflow import MlflowClient

from runner.planner.host_figures import HOSTS_ENV
from tests.helpers.in_process import Cli, run_in_process

ROOT = Path(__file__).resolve().parent.parent
# What Python and the tools write beside any checkout they run in: not the suite's doing.
TOOLS = (".pytest_cache/", "__pycache__/", ".ruff_cache/", ".venv/", ".egg-info/")


def checkout_files() -> set[str] | None:
    """The checkout's untracked and ignored paths, as git lists them (a folder as one entry);
    None outside a git checkout (an unpacked source archive), where there is nothing to ask."""
    listed = subprocess.run(
        ["git", "status", "--porcelain", "--ignored", "--untracked-files=normal"],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    if listed.returncode != 0:
        return None
    paths = {line[3:] for line in listed.stdout.splitlines() if line[:2] in ("??", "!!")}
    return {p for p in paths if not any(tool in p for tool in TOOLS)}


@pytest.fixture(scope="session", autouse=True)
def checkout_untouched() -> Iterator[None]:
    """The suite writes nothing into the checkout: a test's runs, stores and snapshots go to its
    own folder (a default ./mlruns or ./outputs here would be one that does not). Checked after
    each worker's last test, ignored files included."""
    before = checkout_files()
    yield
    if before is not None:
        made = (checkout_files() or set()) - before
        assert not made, f"the suite wrote into the checkout: {sorted(made)}"


@pytest.fixture(scope="session", autouse=True)
def host_figures(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """This host's calibrations (hardware.figures=host) in a folder of each worker's session,
    not the user's cache: a study's test measures the host it runs on, beside the other worker,
    and leaves nothing a later real run would price with."""
    folder = tmp_path_factory.mktemp("hosts")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(HOSTS_ENV, str(folder))
        yield folder


@pytest.fixture(scope="session")
def empty_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An MLflow SQLite store with its tables made once: creating them costs seconds."""
    path = tmp_path_factory.mktemp("template") / "mlflow.db"
    MlflowClient(f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture
def seeded(tmp_path: Path, empty_store: Path) -> str:
    """./mlflow.db of the test's folder, made already, as a user's store is after a first run:
    the URI of what a command run there with the default store records in. Absolute: MLflow
    caches one database engine per URI string in a process."""
    shutil.copy(empty_store, tmp_path / "mlflow.db")
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


@pytest.fixture
def store(seeded: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The seeded store, in the test's folder as the working directory, reached through
    MLFLOW_TRACKING_URI (as jobs composed in this process find it)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", seeded)
    return seeded


@pytest.fixture
def cli(capfd: pytest.CaptureFixture[str]) -> Cli:
    """`python -m runner ARGS` run by this process (tests/helpers/in_process.py): call it with the
    arguments and `cwd=`; it returns the exit code and output as a process's."""

    def run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
        return run_in_process(capfd, *args, cwd=cwd)

    return run
