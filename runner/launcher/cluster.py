"""Who started this process, and as which rank: read from the environment, importing nothing heavy.

torchrun sets TORCHELASTIC_RUN_ID, RANK and WORLD_SIZE. Under SLURM, only a job step started by
`srun` has one process per task (SLURM_STEP_NUM_TASKS); an sbatch script's body or an salloc shell
does not, and there the runner must launch the processes itself or refuse. And where ranks on
this host meet: 127.0.0.1, never another interface.
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import sys
from pathlib import Path

from omegaconf import DictConfig

LOOPBACK = "127.0.0.1"


def bind_gloo_to_loopback() -> None:
    """When every rank is on this host, gloo must use loopback, never another interface."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")


EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")
BELOW_EPHEMERAL = 8192  # how many ports under the kernel's ephemeral range free_port draws from


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for a rendezvous the runner or a test starts there).

    Drawn below the kernel's ephemeral range: the port is only bound seconds later (by rank 0,
    once its interpreter has started), and a port the kernel hands out (bind to 0) may meanwhile
    go to any connection's local end, gloo's many among them. Rank 0 then cannot listen, and
    a rank started by srun waits for it until dist.timeout_s. Outside the range only a process
    that asks for that number could take it."""
    try:
        low = int(EPHEMERAL.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 0
    draws = random.Random()  # not the global generator, which a job may have seeded
    for _ in range(64 if low - BELOW_EPHEMERAL >= 1024 else 0):
        port = draws.randrange(low - BELOW_EPHEMERAL, low)
        with socket.socket() as probe, contextlib.suppress(OSError):
            probe.bind((LOOPBACK, port))
            return port
    with socket.socket() as probe:  # no range below to draw from: the kernel's choice
        probe.bind((LOOPBACK, 0))
        return probe.getsockname()[1]


def world_size(cfg: DictConfig) -> int:
    return cfg.hardware.devices * cfg.hardware.nodes


def external_launcher() -> str | None:
    """The launcher that started this process as one rank of a job, if any."""
    if "TORCHELASTIC_RUN_ID" in os.environ:
        return "torchrun"
    if int(os.environ.get("SLURM_STEP_NUM_TASKS", "1")) > 1:
        return "srun"
    return None


def started_processes() -> int:
    """How many processes the external launcher started for this job."""
    if "TORCHELASTIC_RUN_ID" in os.environ:
        return int(os.environ["WORLD_SIZE"])
    return int(os.environ.get("SLURM_STEP_NUM_TASKS", "1"))


def global_rank() -> int:
    return int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")))


def exit_on_sigterm(*_: object) -> None:
    """A rank's SIGTERM handler. torchrun, srun and the runner's own launcher end the other ranks
    with SIGTERM when one fails (or the job is cancelled): the rank ends through an exception, so
    that its clean-up runs (Lightning finalizes the logger: pending losses are written) and the
    run ends FAILED, even from a collective that would wait for a dead peer until the timeout."""
    sys.exit(f"rank {global_rank()} was terminated: another rank failed, or the job was cancelled")
