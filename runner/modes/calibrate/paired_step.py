"""What the runner's step adds to a plain PyTorch loop's, read step by step: after each of the
runner's steps in mode=calibrate, the same step in a plain loop (runner/plain_loop.py) on the
same model and optimizer, with a batch of the same shape. The median of their differences is the
runner's overhead (hardware.step_overhead_s), the median plain step the time the planner's
products take a share of (compute_efficiency).

Why pairs: taken as two phases one after the other (the runner's steps, then a plain loop's), a
burst of another process's load slowed the one and not the other, and the difference of two 0.6 s
steps read 0.026, 0.25 and 0.30 s beside the suite's other worker where it read 0.0056 s alone.
A burst over a step slows both of its pair alike. The plain step reuses the runner's model and
optimizer, so that it holds no tensors of its own: the runner's rank measures what the math
library keeps between steps (workspace_gib) as before.
"""

from __future__ import annotations

import statistics
from typing import Any

import pytorch_lightning as pl
import torch
from omegaconf import DictConfig

from runner import clock, plain_loop
from runner.losses import LOSSES

# Seconds of pairs after the warm-up, and the fewest pairs, before the run may stop short of its
# max_steps: a 15-layer, 1,024-wide model's pair takes 1.2 s here (its 8 pairs: 10 s of a
# calibration), the default decoder's 0.1 s (all 8)
BUDGET_S, MIN_PAIRS = 4.0, 4


class PlainStepBeside(pl.Callback):
    """Times each runner step (from its start to its end, as the timing callback before it in the
    list does) and then one plain step: from the last warm-up step on (the plain path warms up
    there), keeping the pairs after `warmup` steps; stops the run once the pairs have taken
    BUDGET_S, MIN_PAIRS of them at least."""

    def __init__(self, cfg: DictConfig, warmup: int, device: torch.device) -> None:
        self.cfg, self.warmup, self.device = cfg, warmup, device
        self.started: clock.Stamp = 0.0
        self.steps = 0
        self.runner: list[float] = []
        self.plain: list[float] = []
        self.batch: tuple[torch.Tensor, torch.Tensor] | None = None

    def on_train_start(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        with torch.no_grad():
            x, y = plain_loop.random_batch(self.cfg, module.model, self.device)
        self.batch = x.to(self.device), y.to(self.device)

    def on_train_batch_start(self, *_: Any) -> None:
        self.started = clock.stamp()  # the device's clock, as the timing callback set it

    def on_train_batch_end(self, trainer: pl.Trainer, module: pl.LightningModule, *_: Any) -> None:
        ended = clock.stamp()
        self.steps += 1
        if self.steps < self.warmup:
            return
        assert self.batch is not None
        optimizer = trainer.optimizers[0]
        loss_fn, precision = LOSSES[self.cfg.data.loss], self.cfg.trainer.precision
        plain_loop.step(module.model, optimizer, loss_fn, *self.batch, precision)
        plain_ended = clock.stamp()
        clock.settle()
        if self.steps > self.warmup:
            start, end, plain_end = map(clock.seconds, (self.started, ended, plain_ended))
            self.runner.append(end - start)
            self.plain.append(plain_end - end)
        spent = sum(self.runner) + sum(self.plain)
        trainer.should_stop = len(self.runner) >= MIN_PAIRS and spent >= BUDGET_S

    def overhead_s(self) -> float:
        """The median of (runner step - plain step) over the pairs; 0 where the runner is faster."""
        pairs = zip(self.runner, self.plain, strict=True)
        return max(0.0, statistics.median(r - p for r, p in pairs))

    def plain_s(self) -> float:
        return statistics.median(self.plain)
