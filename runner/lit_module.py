"""The LightningModule: one plain model, one loss, one optimizer. No parallel code here either."""

import pytorch_lightning as pl
import torch
from torch import nn

from runner.losses import LOSSES

OPTIMIZERS: dict[str, type[torch.optim.Optimizer]] = {
    "adamw": torch.optim.AdamW,
    "sgd": torch.optim.SGD,
}


class TrainModule(pl.LightningModule):
    def __init__(self, model: nn.Module, loss: str, optimizer: str, lr: float, weight_decay: float):
        super().__init__()
        self.model = model
        self.loss_fn = LOSSES[loss]
        self.optimizer_name, self.lr, self.weight_decay = optimizer, lr, weight_decay

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], _: int) -> torch.Tensor:
        x, y = batch
        loss = self.loss_fn(self.model(x), y)
        # The mean over data-parallel ranks: the loss of the global batch, as one process sees it.
        self.log("train_loss", loss, on_step=True, on_epoch=False, prog_bar=True, sync_dist=True)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], _: int) -> None:
        x, y = batch
        loss = self.loss_fn(self.model(x), y)
        self.log("val_loss", loss, on_epoch=True, prog_bar=True, sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        optimizer = OPTIMIZERS[self.optimizer_name]
        return optimizer(self.model.parameters(), lr=self.lr, weight_decay=self.weight_decay)
