"""Faults injected from the config, to see what a lost rank does to a job and its record."""

import os
import signal

import pytorch_lightning as pl
from omegaconf import DictConfig


class FaultInjection(pl.Callback):
    def __init__(self, fault: DictConfig) -> None:
        self.kill_rank, self.at_step = fault.kill_rank, fault.at_step

    def on_train_batch_start(self, trainer: pl.Trainer, *_: object) -> None:
        if trainer.global_rank == self.kill_rank and trainer.global_step == self.at_step:
            os.kill(
                os.getpid(), signal.SIGKILL
            )  # abrupt: no handler, no clean-up, like a lost node
