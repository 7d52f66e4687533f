"""Start a job's processes and own its MLflow run.

One device: the job runs in this process. More: the runner starts the job's process group itself
with torch's elastic launcher, never through Lightning's re-execution of sys.argv (under a Hydra
sweep that restarts the whole sweep in every child, Lightning issue 11300). Under torchrun or SLURM
the processes already exist: each runs as one rank and nothing is launched again.

The launching process owns the run: it opens it, hands its id to rank 0 (the only rank that logs),
and ends it FINISHED, or FAILED with the failing rank in the tag `failed_rank`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from runner.errors import ConfigError, JobFailed, Stopped
from runner.launcher import collector
from runner.launcher.cluster import LOOPBACK
from runner.launcher.lifeline import die_with_parent, listen_to_ctrl_c
from runner.launcher.preemption import EXIT_PREEMPTED, Preempted
from runner.network.emulation import Network, enter
from runner.planner.failures import lost_work
from runner.tracking.store import Run


def rank_main(
    cfg: dict[str, Any],
    run_id: str | None,
    progress: str | None = None,
    resume: tuple[str, int] | None = None,
) -> dict[str, float]:
    """What every rank runs (a module-level function: spawned ranks import it by name)."""
    from runner.training.rank import train

    collector.resume()
    listen_to_ctrl_c()

    return train(OmegaConf.create(cfg), run_id, progress, resume)


def spawned_rank_main(cwd: str, network: Network | None, *args: Any) -> dict[str, float]:
    """rank_main in a rank this process spawned: the fork server's child, it ends with the server
    (runner/launcher/lifeline.py). It works where the launcher does: the server, which lives on
    across a sweep's jobs, may have started elsewhere (a job of its own folder, hydra.job.chdir).
    On an emulated network it runs in its node's namespace. Stopped on request, it exits with
    EXIT_PREEMPTED, which the launcher tells from a failure."""
    die_with_parent()
    os.chdir(cwd)
    if network is not None:
        enter(network, int(os.environ["RANK"]))
    try:
        return rank_main(*args)
    except Preempted:
        os._exit(EXIT_PREEMPTED)  # nothing of the rank's is left to clean up: its snapshot is in


def spawn(
    cfg: dict[str, Any],
    world: int,
    record: Run | None = None,
    resume: tuple[str, int] | None = None,
    network: Network | None = None,
) -> dict[str, float]:
    """The job's ranks, forked by the fork server (runner/launcher/fork_server.py) and rendezvoused
    on 127.0.0.1 (on an emulated `network`, on node 0's address in its namespace); rank 0's figures.
    Without a record (mode=calibrate's own measurement) nothing is logged and a failure raises
    JobFailed without being recorded."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from runner.compat.rendezvous_events import name_methods_cheaply

    name_methods_cheaply()  # seconds of every launch otherwise (compat/rendezvous_events.py)
    run_id = record.run_id if record else None
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=world,
        run_id=run_id or uuid.uuid4().hex,
        rdzv_backend="c10d",
        rdzv_endpoint=f"{LOOPBACK}:0",
        local_addr=LOOPBACK,
        max_restarts=0,
        monitor_interval=0.1,
        start_method="forkserver",
    )
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="runner-progress-") as progress, own_signals():
        try:
            launched = elastic_launch(config, spawned_rank_main)
            return launched(os.getcwd(), network, cfg, run_id, progress, resume)[0]
        except SignalException as stop:  # torch's launcher stopped the ranks
            raise Stopped(str(stop)) from None
        except ChildFailedError as failed:
            if run_id and all(f.exitcode == EXIT_PREEMPTED for f in failed.failures.values()):
                step, _ = last_snapshot(Path(cfg["checkpoint"]["dir"]) / run_id, started)
                raise Preempted(step) from None
            steps = reached(progress, world)
            rank, why = root_failure(failed.failures, steps)
            if record is None:
                raise JobFailed(rank, why) from failed
            raise record_failure(cfg, world, record, steps, started, rank, why) from failed


# What torch's launcher answers itself while ranks run (it raises SignalException), and leaves so
TERMINATING = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


@contextlib.contextmanager
def own_signals() -> Iterator[None]:
    """The launcher's signal handlers put back once its ranks have ended: torch's launcher sets its
    own and leaves them, so that a later job in this process (a sweep's next one, a single-device
    job) would answer Ctrl-C with torch's exception rather than Python's."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {sig: signal.getsignal(sig) for sig in TERMINATING}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


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
