"""The logger group: where MLflow records the runs; and its rule (a server must answer)."""

from __future__ import annotations

from dataclasses import dataclass

from runner.errors import ConfigError


@dataclass
class LoggerConfig:
    tracking_uri: str = "${oc.env:MLFLOW_TRACKING_URI,sqlite:///mlflow.db}"
    experiment_name: str = "runner"
    run_name: str | None = None  # None: built from the model, layout and overrides


def check_tracking(uri: str, timeout_s: float = 5.0) -> None:
    """An MLflow server must answer before anything trains: a job that cannot record is lost."""
    if not uri.startswith(("http://", "https://")):
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
