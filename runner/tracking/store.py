"""The MLflow store: the runner owns each run (creates it, names it, ends it) through MlflowClient.

A job's run is opened and ended by runner/tracking/job_run.py, a sweep's parent run by
runner/tracking/sweep_run.py; this module is what both use: the store's client, its experiments, a
run's name, tags and params, and who holds a run open. A process killed outright (SIGKILL: the OOM
killer, a scheduler's hard kill) ends nothing: each run carries its owner (host, process id and
start time), and a run left RUNNING by a process of this host that no longer exists is marked
FAILED, with why, the next time a runner process opens a run in that experiment (each process
looks once: a sweep's jobs share their process's look). A sweep's parent run id
reaches its jobs through an environment variable, so that any launcher that inherits the
environment nests its children.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import socket
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunTag
from mlflow.entities import Run as Recorded
from mlflow.exceptions import MlflowException
from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH
from omegaconf import DictConfig, OmegaConf

from runner.config.logger import store_uri
from runner.mesh import mesh_of

PARENT_RUN_ENV = "RUNNER_MLFLOW_PARENT_RUN_ID"
PARENT_URI_ENV = "RUNNER_MLFLOW_PARENT_URI"
OWNER_TAG = "runner.owner"  # host:pid:start of the process that holds the run open
RESUMED_FROM = "resumed_from"  # <run id>/step_N: another layout's snapshot a run started from


def option_tag(group: str) -> str:
    """The tag of a config group's chosen option where the group's own tag says something else."""
    return f"{group}_option"


PARALLEL_OPTION_TAG = option_tag("parallel")
NESTED_TAG = "mlflow.parentRunId"  # what the MLflow UI nests children by


@dataclass
class Run:
    client: MlflowClient
    run_id: str

    def log_metrics(self, metrics: Mapping[str, float], step: int = 0) -> None:
        self.log_batch("metrics", as_metrics(metrics, step))

    def log_batch(self, kind: str, entries: list[Any]) -> None:
        """Metrics, params or tags, in batches as large as MLflow takes."""
        self.log_together(**{kind: entries})

    def log_together(
        self,
        params: Sequence[Param] = (),
        metrics: Sequence[Metric] = (),
        tags: Sequence[RunTag] = (),
    ) -> None:
        """Params, metrics and tags in one call: MLflow's client splits them into as few of the
        store's batches as its limits allow (100 params, 1,000 entries), each a write of the
        store (a plan's 136 params and 42 metrics: 2 of them, not 3)."""
        self.client.log_batch(self.run_id, metrics=metrics, params=params, tags=tags)

    def end(self, status: str) -> None:
        self.client.set_terminated(self.run_id, status)


def as_metrics(metrics: Mapping[str, float], step: int = 0) -> list[Metric]:
    now = int(time.time() * 1000)
    return [Metric(k, float(v), now, step) for k, v in metrics.items()]


def started(pid: int) -> str | None:
    """When a process started (clock ticks since boot, /proc/<pid>/stat's 22nd field): a pid and
    this name one process, as pids are reused. None: no such process (or no /proc)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()[19]


def owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{started(os.getpid())}"


def abandoned(tag: str) -> bool:
    """Whether the run's owner was a process of this host that no longer exists."""
    host, _, rest = tag.partition(":")
    pid, _, start = rest.partition(":")
    if host != socket.gethostname() or not pid.isdigit() or start == "None":
        return False  # another machine's, or unknown: nothing to tell from here
    return started(int(pid)) != start


def fail_abandoned(client: MlflowClient, experiment: str) -> None:
    """Mark FAILED every run of the experiment left RUNNING by a process that has ended."""
    running = client.search_runs([experiment], filter_string="attributes.status = 'RUNNING'")
    for run in running:
        tag = run.data.tags.get(OWNER_TAG)
        if tag and abandoned(tag):
            _, pid, _ = tag.split(":")
            why = f"its process (pid {pid} on {socket.gethostname()}) ended without closing it"
            client.set_tag(run.info.run_id, "failed_reason", why)
            client.set_terminated(run.info.run_id, "FAILED")


FAILURE_TAGS = ("failed_rank", "failed_reason")


def earlier_failure(client: MlflowClient, run_id: str) -> None:
    """A resumed run's failure tags move to `resumed_after/...`: kept, but a run that then finishes
    no longer reads as failed."""
    tags = client.get_run(run_id).data.tags
    for key in FAILURE_TAGS:
        if key in tags:
            client.set_tag(run_id, f"resumed_after/{key}", tags[key])
            client.delete_tag(run_id, key)


# MLflow 3's UI opens an experiment of this kind on its training runs, not on GenAI traces.
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}


def client_of(tracking_uri: str) -> MlflowClient:
    return MlflowClient(store_uri(tracking_uri))


@contextlib.contextmanager
def one_setup_at_a_time(tracking_uri: str) -> Iterator[None]:
    """MLflow makes a new SQLite store's tables on first use: two processes that both find the
    file new both make them, and one fails ("duplicate column name"). An advisory lock beside the
    file lets one in at a time (a server store orders its writers itself)."""
    if not tracking_uri.startswith("sqlite:///"):
        yield
        return
    lock = Path(tracking_uri.removeprefix("sqlite:///") + ".lock")
    with lock.open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(held, fcntl.LOCK_UN)


def open_experiment(tracking_uri: str, name: str) -> tuple[MlflowClient, str]:
    """A client of the store, and the experiment's id, made if new; stale RUNNING runs failed,
    once a process (a sweep's jobs and its parent run share theirs)."""
    with one_setup_at_a_time(tracking_uri):
        client = client_of(tracking_uri)
        exp = experiment_id(client, name)
    if (client.tracking_uri, exp) not in _checked:
        fail_abandoned(client, exp)
        _checked.add((client.tracking_uri, exp))
    return client, exp


# The experiments whose abandoned runs this process has failed. Once is enough: the runs it
# finds RUNNING later are its own, or another live process's, or one that ended since (failed by
# the next process that opens the experiment). A search of the store each of a sweep's jobs was a
# tenth of a planned job's time.
_checked: set[tuple[str, str]] = set()


def experiment_id(client: MlflowClient, name: str) -> str:
    found = client.get_experiment_by_name(name)
    if found is None:
        try:
            where = artifact_root(client.tracking_uri)
            return client.create_experiment(name, where, tags=EXPERIMENT_KIND)
        except MlflowException:  # another job of a sweep created it first
            found = client.get_experiment_by_name(name)
    if not EXPERIMENT_KIND.items() <= found.tags.items():  # made by another tool, or before
        for key, value in EXPERIMENT_KIND.items():
            client.set_experiment_tag(found.experiment_id, key, value)
    return found.experiment_id


def artifact_root(tracking_uri: str) -> str | None:
    """Where a new experiment keeps its artifacts: beside its SQLite store, in its folder's
    mlruns/. MLflow's default is ./mlruns of the folder the process runs in, which put a store
    elsewhere's artifacts (a test's, a sweep's in its own folder) in that folder. For
    `sqlite:///mlflow.db` the two agree. A server's store: the server chooses."""
    path = store_uri(tracking_uri).removeprefix("sqlite:///")
    if path == store_uri(tracking_uri) or path == ":memory:":
        return None
    return (Path(path).parent / "mlruns").as_uri()


def flat(tree: Mapping[str, Any], sep: str, prefix: str = "") -> dict[str, Any]:
    """A nested mapping's leaves by their paths: {"a": {"b": 1}} -> {"a<sep>b": 1}."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping):
            out |= flat(value, sep, f"{prefix}{key}{sep}")
        else:
            out[f"{prefix}{key}"] = value
    return out


def flatten(cfg: DictConfig) -> dict[str, str]:
    """The resolved config as `a.b.c` -> value strings, MLflow's params."""
    leaves = flat(OmegaConf.to_container(cfg, resolve=True), ".")
    return {key: str(value)[:MAX_PARAM_VAL_LENGTH] for key, value in leaves.items()}


def flat_metrics(figures: Mapping[str, Any]) -> dict[str, float]:
    """Nested figures as `a/b` -> float, MLflow's metrics; what is not a number is left out."""
    leaves = flat(figures, "/")
    return {k: float(v) for k, v in leaves.items() if isinstance(v, bool | int | float)}


def run_name(choices: Mapping[str, str | None], parallel: str, overrides: list[str]) -> str:
    """What the run is, readable in a list: model (or experiment), layout, the other overrides."""
    named = ("model=", "parallel=", "+experiment=", "experiment=")
    head = choices.get("experiment") or choices["model"]
    rest = [o for o in overrides if not o.startswith(named)]
    return " ".join([f"{head} {parallel}", *rest])[:250]


def run_tags(cfg: DictConfig, choices: Mapping[str, str | None], world_size: int) -> dict[str, str]:
    tags = {
        "model": choices["model"],
        "data": choices.get("data"),
        "parallel": mesh_of(cfg).layout,
        # The preset chosen (dp_tp, fsdp_tp): two presets can run the same layout
        PARALLEL_OPTION_TAG: choices.get("parallel"),
        "hardware": choices["hardware"],
        "world_size": str(world_size),
        "mode": cfg.mode,
        # What priced its predictions: the profile's figures, or this host's calibration
        "priced_by": cfg.hardware.get("calibrated") or f"profile {choices['hardware']}",
    }
    if choices.get("experiment"):
        tags["experiment"] = choices["experiment"]
    if os.environ.get(PARENT_RUN_ENV):
        tags[NESTED_TAG] = os.environ[PARENT_RUN_ENV]
    return {k: v for k, v in tags.items() if v is not None}


def description(cfg: DictConfig, choices: Mapping[str, str | None], world_size: int) -> str:
    """A job run's description (the Overview's Description in MLflow's UI): what ran, where."""
    what = choices.get("experiment") or f"{choices['model']} on {choices.get('data')}"
    processes = f"{world_size} process{'es' if world_size > 1 else ''}"
    return f"{what}, layout {mesh_of(cfg).layout} ({processes}), hardware {choices['hardware']}"


@functools.cache
def source_tags() -> dict[str, str]:
    """MLflow's own tags for where a run came from, which its UI shows as the run's Source: the
    command, and the commit of the runner's git checkout (none for an installed wheel). A client's
    create_run sets none of them (MLflow's fluent start_run would, from the script's path)."""
    from mlflow.utils.git_utils import get_git_commit
    from mlflow.utils.mlflow_tags import MLFLOW_GIT_COMMIT, MLFLOW_SOURCE_NAME, MLFLOW_SOURCE_TYPE

    tags = {MLFLOW_SOURCE_NAME: "python -m runner", MLFLOW_SOURCE_TYPE: "LOCAL"}
    commit = get_git_commit(str(Path(__file__).resolve().parent))
    return tags | ({MLFLOW_GIT_COMMIT: commit} if commit else {})


def children(client: MlflowClient, parent: Recorded) -> list[Recorded]:
    """A sweep's job runs, in the order they started."""
    nested = f"tags.`{NESTED_TAG}` = '{parent.info.run_id}'"
    found = client.search_runs([parent.info.experiment_id], nested, order_by=["start_time ASC"])
    return list(found)
