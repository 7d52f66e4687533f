"""A mixture of experts' router, logged each step (runner/models/moe/model.py): how unevenly it
loads the experts, how many tokens full experts dropped, the load-balancing loss. Over every
rank's tokens and the step's micro-batches: one all-reduce of a few numbers per block a step.
Each block's figures come from the ranks that hold it (a pipeline's stage) once per distinct set
of tokens: tensor-parallel ranks route the same tokens, so only their first counts."""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl
import torch
import torch.distributed as dist

from runner.metrics import ROUTER_BALANCE, ROUTER_DROPPED, ROUTER_LOAD


class RouterFigures(pl.Callback):
    def __init__(self, spec: Any, blocks: int, experts: int) -> None:
        self.routers = spec.expert_layers  # a module's mixture-of-experts blocks
        # the model's, on every rank alike (a pipeline's stages hold some of the blocks)
        self.blocks, self.experts = blocks, experts

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, *_: Any
    ) -> None:
        for block in self.routers(pl_module):  # a validation's forwards are not the step's
            block.routed = {}

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, *_: Any
    ) -> None:
        held, experts = [b for b in self.routers(pl_module) if b.routed], self.experts
        # per block: the experts' counts, dropped, the balance loss's sum, forwards
        table = torch.zeros(self.blocks, experts + 3, device=pl_module.device)
        if getattr(trainer.strategy, "coords", {}).get("tp", 0) == 0:
            for b in held:
                r = b.routed
                table[b.index] = torch.cat([r["counts"], torch.stack(
                    [r["dropped"], r["balance"], r["forwards"]])])  # fmt: skip
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(table)
        counts, dropped, balance, forwards = table[:, :experts], *table[:, experts:].t()
        figures = {
            ROUTER_LOAD.name: (counts.max(dim=1).values / counts.mean(dim=1)).max(),
            ROUTER_DROPPED.name: dropped.sum() / counts.sum(),
            ROUTER_BALANCE.name: (balance / forwards).mean(),
        }
        for name, value in figures.items():
            pl_module.log(name, value.item(), on_step=True, on_epoch=False)
