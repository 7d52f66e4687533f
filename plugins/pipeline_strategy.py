"""A Lightning strategy for pipeline parallelism, driving torch.distributed.pipelining.

Lightning has none. This one reuses DDPStrategy's process group, ranks and reductions but, where
DDP would wrap the model, splits it into this rank's stages and builds the schedule; each training
step is then one `schedule.step` over the micro-batches and one optimizer step. The LightningModule
stays as it is: the strategy switches it to manual optimization and runs the step itself.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist
from pytorch_lightning.strategies import DDPStrategy
from torch import nn
from torch.distributed.pipelining import PipelineStage

from runner.models.decoder import Decoder
from runner.parallel.pipeline import (
    MULTI_STAGE,
    SCHEDULES,
    stage_module,
    stages_of,
)
from runner.parallel.pipeline_trace import PipelineTrace


class PipelineStrategy(DDPStrategy):
    strategy_name = "pipeline"

    def __init__(self, schedule: str, microbatches: int, split: list[int], virtual: int, **kw: Any):
        super().__init__(**kw)
        self.schedule_name, self.microbatches = schedule, microbatches
        self.split, self.virtual = split, virtual
        self.trace = PipelineTrace()
        self.step_record: dict[str, Any] = {}  # the last step's timeline, for RankTiming

    # --- where DDP would wrap the model: split it and build the schedule ---
    def configure_ddp(self) -> None:
        module = self.lightning_module
        module.automatic_optimization = False  # the schedule runs forward and backward
        full, n_stages = module.model, len(self.split)
        self.stage_ids = stages_of(self.global_rank, self.world_size, self.virtual)
        parts = [stage_module(full, s, self.split) for s in self.stage_ids]
        module.model = nn.ModuleList(parts)  # this rank's parameters only: its optimizer's
        self.stages = [
            PipelineStage(part, s, n_stages, self.root_device)
            for part, s in zip(parts, self.stage_ids, strict=True)
        ]
        self.trace.instrument(self.stages)
        multi = self.schedule_name in MULTI_STAGE
        self.schedule = SCHEDULES[self.schedule_name](
            self.stages if multi else self.stages[0],
            n_microbatches=self.microbatches,
            loss_fn=module.loss_fn,
        )
        self.first, self.last = 0 in self.stage_ids, n_stages - 1 in self.stage_ids
        # The decoder's embedding is tied to its output layer: first and last stage each hold a
        # copy and sum their gradients every step (Megatron's embedding all-reduce).
        ends = sorted({0, (n_stages - 1) % self.world_size})
        tied = isinstance(full, Decoder) and len(ends) == 2
        group = dist.new_group(ends) if tied else None  # every rank takes part in new_group
        self.tied = group if (self.first or self.last) else None

    def _run_schedule(self, batch: Any, train: bool) -> torch.Tensor:
        x, y = batch
        losses: list[torch.Tensor] = []
        args = (x,) if self.first else ()
        kwargs = {"target": y, "losses": losses} if self.last else {}
        (self.schedule.step if train else self.schedule.eval)(*args, **kwargs)
        return torch.stack(losses).mean() if losses else torch.zeros((), device=self.root_device)

    def _sync_tied_embedding(self) -> list[tuple[float, float]]:
        if self.tied is None:
            return []
        part = self.lightning_module.model[0 if self.first else -1]
        start = time.perf_counter()
        dist.all_reduce(part.embed.weight.grad, group=self.tied)
        return [(start, time.perf_counter())]

    def _from_last_stage(self, loss: torch.Tensor) -> tuple[torch.Tensor, tuple[float, float]]:
        """Only the last stage computes the loss; every rank gets it (rank 0 logs it)."""
        start = time.perf_counter()
        dist.broadcast(loss, src=(len(self.split) - 1) % self.world_size)
        return loss, (start, time.perf_counter())

    def training_step(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        optimizer = self.lightning_module.optimizers()  # Lightning's wrapper counts the step
        optimizer.zero_grad()
        start = time.perf_counter()
        loss = self._run_schedule(args[0], train=True)
        syncs = self._sync_tied_embedding()
        window_end = time.perf_counter()
        optimizer.step()
        optimizer_end = time.perf_counter()
        loss, broadcast = self._from_last_stage(loss)
        actions, sent = self.trace.take()
        self.step_record = {
            "window": (start, window_end),
            "optimizer": (window_end, optimizer_end),
            "actions": actions,
            "sent_bytes": sent,
            "syncs": [*syncs, broadcast],
        }
        self.lightning_module.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, *args: Any, **kwargs: Any) -> None:
        loss, _ = self._from_last_stage(self._run_schedule(args[0], train=False))
        self.trace.take()  # evaluation is not part of any training step's timeline
        self.lightning_module.log("val_loss", loss, prog_bar=True)
