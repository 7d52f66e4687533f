"""Preemption and time limits: a job told to stop soon writes a snapshot at once and ends so that
it can be resumed where it stopped, in the same MLflow run.

SLURM warns a job before its time limit (`--signal=USR1@60`: SIGUSR1 to every task 60 s ahead)
and a preempting scheduler does alike; a person can send SIGUSR1 to the job's process group. Each
rank notes it (`listen`); the ranks agree at the next step, in the loss's mean over ranks that
every step already runs (runner/training/module.py), so all write the snapshot after the same
step (runner/snapshots.py). The job then ends as preempted: its run KILLED, tagged
`preempted_at_step`, exit code 3; under SLURM it asks to be requeued (`scontrol requeue`), and the
requeued job (`resume=auto`) continues the run. Lightning's own SLURM requeue is off
(runner/training/rank.py): one answer to the signal, not two. Torch-free.
"""

from __future__ import annotations

import os
import signal
import subprocess

SIGNAL = signal.SIGUSR1
EXIT_PREEMPTED = 3
_requested = False


class Preempted(Exception):
    """The job stopped after writing its snapshot at `step`."""

    def __init__(self, step: int) -> None:
        super().__init__(f"preempted: stopped after step {step}, its snapshot written")
        self.step = step

    def __reduce__(self) -> tuple[type, tuple[int]]:
        return Preempted, (self.step,)


def _note(*_: object) -> None:
    global _requested
    _requested = True


def listen() -> None:
    """In a rank: note the signal, to be acted on at the end of the step."""
    signal.signal(SIGNAL, _note)


def ignore() -> None:
    """In the launcher (and so in the fork server it starts): the signal is the ranks' to act
    on; its default would end the process."""
    signal.signal(SIGNAL, signal.SIG_IGN)


def requested() -> bool:
    return _requested


def slurm_job() -> str | None:
    return os.environ.get("SLURM_JOB_ID")


def requeued(job: str) -> str:
    """The record of a requeue that worked."""
    return f"requeued SLURM job {job}"


def requeue(job: str) -> str | None:
    """Ask SLURM to queue the job again; None if it did, else why not. SLURM may end this
    process as soon as it does: what must be recorded goes first."""
    done = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True)
    return None if done.returncode == 0 else done.stderr.strip()
