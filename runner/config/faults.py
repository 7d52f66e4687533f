"""Faults injected on purpose, the process group's timeout, and snapshots; and their rules."""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import DictConfig

from runner.choices import BACKENDS
from runner.errors import one_of, require
from runner.launcher.cluster import world_size


@dataclass
class FaultConfig:
    """Faults injected on purpose, to see what a lost rank does to the job and its record."""

    kill_rank: int | None = None  # this rank ends abruptly (SIGKILL) ...
    hang_rank: int | None = None  # ... or stays alive but stops taking part in collectives ...
    at_step: int | None = None  # ... when it starts this optimizer step
    disk_full_at_step: int | None = None  # the snapshot at this step fails: no space left
    # SIGUSR1 to every rank when this step starts, as SLURM warns of a time limit or a
    # preemption: the job snapshots and stops, to be resumed (runner/launcher/preemption.py)
    preempt_at_step: int | None = None


@dataclass
class DistConfig:
    """The process group's behaviour when something goes wrong."""

    # A collective that waits longer than this fails its rank, and so the job: what a lost or hung
    # rank costs before anyone notices.
    timeout_s: float = 600.0
    # auto: nccl on GPUs, gloo on CPUs. gloo on GPUs lets ranks share one device (NCCL refuses
    # two ranks on a GPU): how make gpu-check runs two data-parallel ranks on a one-GPU machine.
    backend: str = "auto"


@dataclass
class CheckpointConfig:
    """Snapshots of the whole training state, to resume from after a failure."""

    every_n_steps: int = 0  # 0: none
    dir: str = (
        "snapshots"  # <dir>/<run id>/step_<n>/, one file per rank (torch.distributed.checkpoint)
    )


def check_fault(cfg: DictConfig) -> None:
    f, world = cfg.fault, world_size(cfg)
    every = cfg.checkpoint.every_n_steps
    require(every >= 0, "checkpoint.every_n_steps", f"must be 0 (none) or more, got {every}")
    full = f.disk_full_at_step
    require(
        full is None or (every > 0 and full > 0 and full % every == 0),
        "fault.disk_full_at_step",
        f"must be a step that takes a snapshot (a multiple of checkpoint.every_n_steps={every})",
    )
    stop = f.get("preempt_at_step")
    require(stop is None or stop > 0, "fault.preempt_at_step", f"must be positive, got {stop}")
    require(cfg.dist.timeout_s > 0, "dist.timeout_s", f"must be positive, got {cfg.dist.timeout_s}")
    one_of(cfg.dist.backend, "dist.backend", BACKENDS)
    require(
        cfg.dist.backend != "nccl" or cfg.hardware.accelerator == "gpu",
        "dist.backend",
        "nccl runs between GPUs: hardware.accelerator is cpu (use auto or gloo)",
    )
    require(
        f.kill_rank is None or f.hang_rank is None,
        "fault.hang_rank",
        "one fault at a time: fault.kill_rank is set too",
    )
    for key in ("kill_rank", "hang_rank"):
        if f[key] is None:
            continue
        require(
            world > 1 and 0 <= f[key] < world,
            f"fault.{key}",
            f"must be a rank of a job of 2 or more processes (0..{world - 1}), got {f[key]}",
        )
        require(
            f.at_step is not None and 0 <= f.at_step < cfg.trainer.max_steps,
            "fault.at_step",
            f"must be a step in 0..trainer.max_steps-1, got {f.at_step}",
        )
