"""The LightningModule: one plain model, one loss, one optimizer. No parallel code here either."""

from collections.abc import Callable

import pytorch_lightning as pl
import torch
import torch.distributed as dist
from torch import nn

from runner.launcher import preemption
from runner.losses import LOSSES, on_shards, replicated, sharded
from runner.metrics import TRAIN_LOSS, VAL_LOSS
from runner.optimizers import OPTIMIZERS, options


def mean_over_ranks(value: torch.Tensor, flag: bool = False) -> Callable[[], torch.Tensor]:
    """Start the mean of `value` over every rank; the returned function waits for it and gives
    the mean and, beside it, whether any rank raised `flag` (a stop asked for: runner/
    preemption.py; it rides along rather than costing a collective of its own). Each data-parallel
    rank holds its shard's loss and a tensor-parallel shard a copy of its replica's, so the mean
    over all ranks is the loss of the global batch, as one process sees it."""
    value = value.detach().float()
    total = torch.stack([value, torch.full_like(value, float(flag))])
    if not (dist.is_available() and dist.is_initialized()):
        return lambda: total
    work = dist.all_reduce(total, async_op=True)  # a sum: gloo has no average

    def wait() -> torch.Tensor:
        work.wait()
        return total / dist.get_world_size()

    return wait


class TrainModule(pl.LightningModule):
    def __init__(self, model: nn.Module, loss: str, optimizer: str, lr: float, weight_decay: float):
        super().__init__()
        self.model = model
        self.loss_fn = replicated(LOSSES[loss])
        # The last output was split over the vocabulary: its loss's backward runs as it ran.
        self.sharded = False
        self.optimizer_name, self.lr, self.weight_decay = optimizer, lr, weight_decay
        self.global_loss: Callable[[], torch.Tensor] | None = None
        self.stop_agreed: torch.Tensor | None = None  # a stop asked for on some rank, agreed on

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], _: int) -> torch.Tensor:
        loss = self.loss(*batch)
        # Read after backward, which waits for the gradients anyway. Logging with sync_dist would
        # stop every rank here for a barrier and an all-reduce (measured: 4-7 ms of a 110 ms step
        # of 2 CPU ranks, most of it one rank waiting for the other mid-step).
        self.global_loss = mean_over_ranks(loss, preemption.requested())
        return loss

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = self.model(x)
        self.sharded = sharded(out)
        with on_shards(self.sharded):
            return self.loss_fn(out, y)

    def backward(self, loss: torch.Tensor, *args: object, **kwargs: object) -> None:
        with on_shards(self.sharded):
            super().backward(loss, *args, **kwargs)

    def on_after_backward(self) -> None:
        if self.global_loss is not None:
            (loss, stop), self.global_loss = self.global_loss(), None
            self.stop_agreed = stop  # > 0 on every rank alike: read after the step (a tensor)
            self.log(TRAIN_LOSS.name, loss, on_step=True, on_epoch=False, prog_bar=True)

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], _: int) -> None:
        loss = self.loss(*batch)
        self.log(VAL_LOSS.name, loss, on_epoch=True, prog_bar=True, sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        params = list(self.model.parameters())
        optimizer = OPTIMIZERS[self.optimizer_name]
        extra = options(self.optimizer_name, params)
        return optimizer(params, lr=self.lr, weight_decay=self.weight_decay, **extra)
