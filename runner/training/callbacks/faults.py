"""Faults injected from the config, to see what a lost rank does to a job and its record."""

import os
import signal
import threading

import pytorch_lightning as pl
from omegaconf import DictConfig


class FaultInjection(pl.Callback):
    def __init__(self, fault: DictConfig, start: int = 0) -> None:
        self.kill_rank, self.hang_rank, self.at_step = (
            fault.kill_rank,
            fault.hang_rank,
            fault.at_step,
        )
        self.resumed = start > 0  # a run resumed after its fault is not failed again
        self.preempt_at = fault.get("preempt_at_step")

    def on_train_batch_start(self, trainer: pl.Trainer, *_: object) -> None:
        if trainer.global_step == self.preempt_at and not self.resumed:
            os.kill(os.getpid(), signal.SIGUSR1)  # every rank, as SLURM signals every task
        if self.resumed or trainer.global_step != self.at_step:
            return
        if trainer.global_rank == self.kill_rank:
            os.kill(
                os.getpid(), signal.SIGKILL
            )  # abrupt: no handler, no clean-up, like a lost node
        if trainer.global_rank == self.hang_rank:
            threading.Event().wait()  # alive, but never at the next collective: a hung rank


class Progress(pl.Callback):
    """Each rank notes the step it has reached in a file of its own, so that when a collective
    times out, the launcher can tell the rank that stopped from those left waiting for it. The
    file stays open: a step costs one small write in place, not an open and a close."""

    def __init__(self, folder: str | None, start: int = 0) -> None:
        self.folder, self.start = folder, start
        self.fd: int | None = None

    def on_train_start(self, trainer: pl.Trainer, *_: object) -> None:
        if self.folder:
            path = os.path.join(self.folder, f"rank_{trainer.global_rank}")
            self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)

    def on_train_batch_start(self, trainer: pl.Trainer, *_: object) -> None:
        if self.fd is not None:  # fixed width: a write in place never leaves a longer number's tail
            os.pwrite(self.fd, b"%12d" % (self.start + trainer.global_step), 0)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
