"""A mixture of experts' router, logged each step (runner/models/moe/model.py): how unevenly it
loads the experts, how many tokens full experts dropped, the load-balancing loss. Over every
rank's tokens: one all-reduce of a few numbers a step (data-parallel ranks route their own)."""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl
import torch
import torch.distributed as dist

from runner.metrics import ROUTER_BALANCE, ROUTER_DROPPED, ROUTER_LOAD


def routers(module: torch.nn.Module) -> list[Any]:
    """The model's mixture-of-experts blocks: those that record what they routed."""
    return [m for m in module.modules() if hasattr(m, "routed") and hasattr(m, "top_k")]


class RouterFigures(pl.Callback):
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, *_: Any
    ) -> None:
        blocks = [b for b in routers(pl_module) if b.routed]
        if not blocks:
            return
        counts = torch.stack([b.routed["counts"].float() for b in blocks])  # (blocks, experts)
        dropped = torch.stack([b.routed["dropped"].float() for b in blocks]).sum()
        balance = torch.stack([b.routed["balance"].float() for b in blocks]).mean()
        together = torch.cat([counts.flatten(), dropped[None], balance[None]])
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(together)  # a sum: the balance loss is averaged below
            together[-1] /= dist.get_world_size()
        counts = together[: counts.numel()].view_as(counts)
        load = (counts.max(dim=1).values / counts.mean(dim=1)).max()
        figures = {
            ROUTER_LOAD.name: load,
            ROUTER_DROPPED.name: together[-2] / counts.sum(),
            ROUTER_BALANCE.name: together[-1],
        }
        for name, value in figures.items():
            pl_module.log(name, value.item(), on_step=True, on_epoch=False)
