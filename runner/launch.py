"""Start a job's processes and own its MLflow run.

One device: the job runs in this process. More: the runner starts the job's process group itself
with torch's elastic launcher, never through Lightning's re-execution of sys.argv (under a Hydra
sweep that restarts the whole sweep in every child, Lightning issue 11300). Under torchrun or SLURM
the processes already exist: each runs as one rank and nothing is launched again.

The launching process owns the run: it opens it, hands its id to rank 0 (the only rank that logs),
and ends it FINISHED, or FAILED with the failing rank in the tag `failed_rank`.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

from runner.cluster import external_launcher, global_rank, world_size
from runner.tracking import Run, recorded_run

LOOPBACK = "127.0.0.1"


def bind_gloo_to_loopback() -> None:
    """When every rank is on this host, gloo must use loopback, never another interface."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")


def rank_main(cfg: dict[str, Any], run_id: str | None) -> dict[str, float]:
    """What every rank runs (a module-level function: spawned ranks import it by name)."""
    from runner.training import train

    return train(OmegaConf.create(cfg), run_id)


def run(
    cfg: DictConfig, choices: Mapping[str, str | None], overrides: list[str]
) -> dict[str, float]:
    world = world_size(cfg)
    resolved = OmegaConf.to_container(cfg, resolve=True)
    if world > 1 and external_launcher() is None:
        bind_gloo_to_loopback()
        with recorded_run(cfg, choices, overrides, world) as record:
            return spawn(resolved, world, record)
    if os.environ.get("MASTER_ADDR") in (LOOPBACK, "localhost"):
        bind_gloo_to_loopback()
    if global_rank() != 0:  # one rank among those torchrun or srun started: rank 0 records
        return rank_main(resolved, None)
    with recorded_run(cfg, choices, overrides, world) as record:
        if world > 1:
            signal.signal(signal.SIGTERM, _exit_on_sigterm)
        return rank_main(resolved, record.run_id)


def _exit_on_sigterm(*_: object) -> None:
    # torchrun and srun end the other ranks with SIGTERM when one fails: the run ends FAILED.
    sys.exit("rank 0 was terminated: another rank failed, or the job was cancelled")


def spawn(cfg: dict[str, Any], world: int, record: Run) -> dict[str, float]:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    # Ranks fork from a server that has imported torch and Lightning once (seconds each), rather
    # than each importing them again; the server lives on across a sweep's jobs. Nothing of this
    # process (its MLflow connection, its threads) is forked: the server starts clean.
    multiprocessing.set_forkserver_preload(["runner.training"])

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
    try:
        return elastic_launch(config, rank_main)(cfg, record.run_id)[0]
    except ChildFailedError as failed:
        rank, failure = root_failure(failed.failures)
        record.client.set_tag(record.run_id, "failed_rank", str(rank))
        raise JobFailed(rank, failure) from failed


def root_failure(failures: Mapping[int, Any]) -> tuple[int, Any]:
    """The rank that brought the job down, not its victims. A rank killed by a signal left no
    error of its own; its peers fail on the broken connection, and may record that before the
    launcher notices the death. So: the first of the killed ranks, else the first to fail."""
    killed = {rank: f for rank, f in failures.items() if f.exitcode < 0}
    pool = killed or failures
    rank = min(pool, key=lambda r: pool[r].timestamp)
    return rank, pool[rank]


class JobFailed(RuntimeError):
    """A rank of the job failed; the run is FAILED and names it."""

    def __init__(self, rank: int, failure: Any) -> None:
        reason = failure.message
        if isinstance(reason, dict):  # a Python error the rank recorded
            reason = reason.get("message", reason)
        if not reason:  # killed, or exited without a word
            reason = f"exit code {failure.exitcode}"
        super().__init__(f"rank {rank} failed: {reason}")
        self.rank = rank
