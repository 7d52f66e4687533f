"""Start a job's processes and own its MLflow run.

One device: the job runs in this process. More: the runner starts the job's process group itself
with torch's elastic launcher, never through Lightning's re-execution of sys.argv (under a Hydra
sweep that restarts the whole sweep in every child, Lightning issue 11300). Under torchrun or SLURM
the processes already exist: each runs as one rank and nothing is launched again.

The launching process owns the run: it opens it, hands its id to rank 0 (the only rank that logs),
and ends it FINISHED, or FAILED with the failing rank in the tag `failed_rank`.
"""

from __future__ import annotations

import json
import multiprocessing
import multiprocessing.forkserver
import os
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from runner import preemption
from runner.errors import ConfigError
from runner.lifeline import LAUNCHER_ENV, die_with_parent, listen_to_ctrl_c
from runner.planner.failures import lost_work
from runner.preemption import EXIT_PREEMPTED, Preempted
from runner.tracking import Run

LOOPBACK = "127.0.0.1"


def bind_gloo_to_loopback() -> None:
    """When every rank is on this host, gloo must use loopback, never another interface."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")


def rank_main(
    cfg: dict[str, Any],
    run_id: str | None,
    progress: str | None = None,
    resume: tuple[str, int] | None = None,
) -> dict[str, float]:
    """What every rank runs (a module-level function: spawned ranks import it by name)."""
    from runner.training.rank import train

    listen_to_ctrl_c()

    return train(OmegaConf.create(cfg), run_id, progress, resume)


def spawned_rank_main(*args: Any) -> dict[str, float]:
    """rank_main in a rank this process spawned: the fork server's child, it ends with the server
    (runner/lifeline.py). Stopped on request, it exits with EXIT_PREEMPTED, which the launcher
    tells from a failure."""
    die_with_parent()
    try:
        return rank_main(*args)
    except Preempted:
        os._exit(EXIT_PREEMPTED)  # nothing of the rank's is left to clean up: its snapshot is in


# What every rank imports (torch, Lightning, the strategies) and what rank 0 records with after
# training (MLflow, matplotlib): seconds of imports, done once in the fork server.
PRELOAD = [
    "runner.lifeline",  # first: the server ends with this process (runner/lifeline.py)
    "runner.training.rank",
    "runner.training.record",
    "mlflow.store.tracking.sqlalchemy_store",
]


def start_fork_server() -> None:
    """Ranks fork from a server that has imported PRELOAD once, rather than each importing it
    again; the server lives on across a sweep's jobs. Started first, it imports while this process
    opens the MLflow run. Nothing of this process (its MLflow connection, its threads) is forked:
    the server starts clean."""
    os.environ[LAUNCHER_ENV] = str(os.getpid())
    preemption.ignore()  # the ranks' signal; the server and the tracker inherit the ignoring
    multiprocessing.set_forkserver_preload(PRELOAD)
    multiprocessing.forkserver.ensure_running()


def spawn(
    cfg: dict[str, Any], world: int, record: Run, resume: tuple[str, int] | None = None
) -> dict[str, float]:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=world,
        run_id=record.run_id,
        rdzv_backend="c10d",
        rdzv_endpoint=f"{LOOPBACK}:0",
        local_addr=LOOPBACK,
        max_restarts=0,
        monitor_interval=0.1,
        start_method="forkserver",
    )
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="runner-progress-") as progress:
        try:
            launched = elastic_launch(config, spawned_rank_main)
            return launched(cfg, record.run_id, progress, resume)[0]
        except ChildFailedError as failed:
            if all(f.exitcode == EXIT_PREEMPTED for f in failed.failures.values()):
                step, _ = last_snapshot(Path(cfg["checkpoint"]["dir"]) / record.run_id, started)
                raise Preempted(step) from None
            steps = reached(progress, world)
            rank, why = root_failure(failed.failures, steps)
            raise record_failure(cfg, world, record, steps, started, rank, why) from failed


def in_process(
    cfg: dict[str, Any], world: int, record: Run, resume: tuple[str, int] | None = None
) -> dict[str, float]:
    """rank_main in this process (one device, or rank 0 of those torchrun or SLURM started); a
    failure is recorded as a launched job's is."""
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="runner-progress-") as progress:
        try:
            return rank_main(cfg, record.run_id, progress, resume)
        except (ConfigError, Preempted):
            raise  # bad input found late: one line, exit code 2, as found early; or a stop
        except Exception as error:
            steps = reached(progress, 1)
            why = first_line(f"{type(error).__name__}: {error}")
            raise record_failure(cfg, world, record, steps, started, 0, why) from error


def record_failure(
    cfg: dict[str, Any],
    world: int,
    record: Run,
    steps: Mapping[int, int],
    started: float,
    rank: int,
    why: str,
) -> JobFailed:
    """Tag the failing rank and log the work lost since the last snapshot: the failure to raise."""
    record.client.set_tag(record.run_id, "failed_rank", str(rank))
    saved, since = last_snapshot(Path(cfg["checkpoint"]["dir"]) / record.run_id, started)
    lost = max(steps.values(), default=0) - saved  # redone from the last snapshot
    spent = time.time() - since
    record.log_metrics(lost_work(OmegaConf.create(cfg["hardware"]), world, lost, spent))
    return JobFailed(rank, why)


def last_snapshot(run_dir: Path, started: float) -> tuple[int, float]:
    """(step, time) of the run's newest complete snapshot; (0, launch time) without one."""
    marks = sorted(run_dir.glob("step_*/runner.json"))
    if not marks:
        return 0, started
    return json.loads(marks[-1].read_text())["step"], max(marks[-1].stat().st_mtime, started)


def reached(folder: str, world: int) -> dict[int, int]:
    """The step each rank had reached (training/callbacks/faults.py: Progress); -1: none yet."""
    steps = dict.fromkeys(range(world), -1)
    for path in Path(folder).iterdir():
        steps[int(path.name.split("_")[1])] = int(path.read_text() or -1)
    return steps


def root_failure(failures: Mapping[int, Any], steps: Mapping[int, int]) -> tuple[int, str]:
    """The rank that brought the job down, not its victims, and why.

    A rank that hung is not among the failures at all: its peers time out waiting for it in a
    collective, at a step it never reached (on GPUs, NCCL's watchdog aborts them: they die by a
    signal too). A rank killed by a signal left no error of its own; its peers fail on the broken
    connection and may record that before the launcher notices the death. So: a rank left
    behind, else the first killed rank, else the first to fail.
    """
    behind = [r for r, step in steps.items() if step < max(steps.values()) and r not in failures]
    if behind:
        rank = min(behind, key=lambda r: steps[r])
        first = min(failures, key=lambda r: failures[r].timestamp)
        return rank, (
            f"stopped taking part at step {steps[rank] + 1}: the others waited for it until "
            f"dist.timeout_s ran out (rank {first}: {reason(failures[first])})"
        )
    killed = {rank: f for rank, f in failures.items() if f.exitcode < 0}
    pool = killed or failures
    rank = min(pool, key=lambda r: pool[r].timestamp)
    return rank, reason(pool[rank])


def reason(failure: Any) -> str:
    message = failure.message
    if isinstance(message, dict):  # a Python error the rank recorded
        message = message.get("message", message)
    return first_line(str(message or "")) or f"exit code {failure.exitcode}"  # killed, or mute


def first_line(text: str) -> str:
    """An error raised in a DDP hook's callback carries torch's "At:" frames too: its first line."""
    return next((line for line in text.splitlines() if line.strip()), "")


class JobFailed(RuntimeError):
    """A rank of the job failed; the run is FAILED and names it."""

    def __init__(self, rank: int, why: str) -> None:
        super().__init__(f"rank {rank} failed: {why}")
        self.rank, self.why = rank, why

    def __reduce__(self) -> tuple[type, tuple[int, str]]:  # pickled by a sweep on SLURM
        return JobFailed, (self.rank, self.why)
