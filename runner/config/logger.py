"""The logger group: where MLflow records the runs; its rule (a server must answer); the store's URI
as a client opens it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from runner.errors import ConfigError


@dataclass
class LoggerConfig:
    tracking_uri: str = "${oc.env:MLFLOW_TRACKING_URI,sqlite:///mlflow.db}"
    experiment_name: str = "runner"
    run_name: str | None = None  # None: built from the model, layout and overrides
    # MLflow's system metrics of every node while it trains (runner/training/callbacks/
    # system_metrics.py): CPU, memory, disk, network, and GPU where there is one
    system_metrics: bool = True
    # MLflow's default. A run shorter still has its sample: the last part-interval is logged too.
    # Each sample queries the store from a thread of rank 0: every second, it slowed a profiled
    # rank's traced steps on a busy 2-core host (tests/test_profiling.py).
    system_metrics_interval_s: float = 10.0


# The stores MLflow's tracking client opens: a folder (a path, file:), SQL databases, a server.
SCHEMES = ("sqlite", "file", "postgresql", "mysql", "mssql", "http", "https", "databricks")


def check_tracking(uri: str, timeout_s: float = 5.0) -> None:
    """A store MLflow can open, and a server that answers, before anything trains: a job that
    cannot record is lost."""
    scheme = uri.split("://", 1)[0].split("+", 1)[0] if "://" in uri else ""
    if scheme not in ("", *SCHEMES):
        raise ConfigError(
            "logger.tracking_uri",
            f"{uri}: no MLflow store of scheme {scheme}://; use a path or one of "
            + ", ".join(f"{s}://" for s in SCHEMES),
        )
    if scheme not in ("http", "https"):
        return  # a local store: nothing to reach
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=timeout_s) as answer:
            answer.read()
    except (urllib.error.URLError, OSError) as failure:
        reason = getattr(failure, "reason", failure)
        raise ConfigError(
            "logger.tracking_uri", f"no MLflow server answers at {uri} ({reason})"
        ) from None


def store_uri(tracking_uri: str) -> str:
    """The store's URI for a client: a relative SQLite path made absolute. MLflow keeps one
    database engine per URI string in a process, and SQLite opens a relative path from the folder
    the process is in when it connects: a process that runs jobs in several folders (a sweep with
    hydra.job.chdir, ranks forked by a server that started elsewhere) would write them all into
    one folder's store."""
    if tracking_uri.startswith("sqlite:///") and not tracking_uri.startswith("sqlite:////"):
        path = tracking_uri.removeprefix("sqlite:///")
        if path != ":memory:":
            return f"sqlite:///{Path(path).resolve()}"
    return tracking_uri
