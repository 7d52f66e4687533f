"""mode=train: open the run, then train in this process (one device, or one rank that torchrun or
SLURM started) or start the job's processes (runner/launcher/launch.py); a resumed run continues its
snapshot's MLflow run.

The ranks run in other processes: each is handed the resolved config as a plain container and
resolves its own job from it (the job here is the launcher's, for its checks)."""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from runner.job import Job
from runner.launcher import collector
from runner.launcher.cluster import (
    LOOPBACK,
    bind_gloo_to_loopback,
    exit_on_sigterm,
    external_launcher,
    global_rank,
    world_size,
)
from runner.launcher.fork_server import start_fork_server


def run(
    cfg: DictConfig, job: Job | None, choices: Mapping[str, str | None], overrides: list[str]
) -> dict[str, float]:
    world = world_size(cfg)
    launches = world > 1 and external_launcher() is None
    if launches:  # first: the server's imports overlap this process's own, below
        bind_gloo_to_loopback()
        start_fork_server()
    # MLflow and torch: seconds, after the server has started
    from runner.launcher.launch import in_process, rank_main, spawn
    from runner.tracking.job_run import recorded_run

    if launches:  # the launcher's imports are in (a rank resumes it after its own: launch.py)
        collector.resume()

    resumed, resume, origin = None, None, None
    if cfg.resume:
        from runner.snapshots import find, moved  # imports torch: only when a snapshot is wanted

        found = find(cfg)
        if found is not None:
            resumed, resume = found.run_id, (str(found.folder.resolve()), found.step)
            if resumed is None:  # another layout's: a run of this layout's own
                origin = found.origin
                if global_rank() == 0:
                    print(moved(found, cfg), flush=True)
        elif global_rank() == 0:
            print(f"resume=auto: no snapshot under {cfg.checkpoint.dir} yet, a new run", flush=True)
    resolved = OmegaConf.to_container(cfg, resolve=True)
    resolved["checkpoint"]["dir"] = str(Path(cfg.checkpoint.dir).resolve())  # for every rank
    if launches:
        from runner.network.emulation import emulated, link_params

        with emulated(cfg) as network:  # None but on an emulated network of nodes
            params = link_params(network)
            with recorded_run(cfg, choices, overrides, world, resumed, origin, params) as record:
                return spawn(resolved, world, record, resume, network)
    if os.environ.get("MASTER_ADDR") in (LOOPBACK, "localhost"):
        bind_gloo_to_loopback()
    if global_rank() != 0:  # one rank among those torchrun or srun started: rank 0 records
        return rank_main(resolved, None, None, resume)
    with recorded_run(cfg, choices, overrides, world, resumed, origin) as record:
        if world > 1:
            signal.signal(signal.SIGTERM, exit_on_sigterm)
        return in_process(resolved, world, record, resume)
