"""A Lightning strategy for pipeline parallelism, driving torch.distributed.pipelining.

Lightning has none. This one reuses the mesh strategy's process group and device mesh but, where
DDP would wrap the model, splits it into this rank's stages (each split over the mesh's tp
dimension, and wrapped in DDP over its dp dimension, where those have more than one rank) and
builds the schedule over the pp dimension; each training step is then one `schedule.step` over the
micro-batches and one optimizer step. The LightningModule stays as it is: the strategy switches it
to manual optimization and runs the step itself.

With one stage (parallel.pp=1, parallel.microbatches > 1) this is gradient accumulation: the
schedule runs forward and backward per micro-batch, scales the summed gradients by 1/m, and a
DDP-wrapped stage all-reduces on the last micro-batch's backward only (no_sync on the others).
"""

from __future__ import annotations

import itertools
from typing import Any

import torch
import torch.distributed as dist
from omegaconf import DictConfig
from torch import nn
from torch.distributed.pipelining import PipelineStage
from torch.distributed.tensor import DTensor

from runner import clock
from runner.autocast import ACTIVATIONS
from runner.choices import MULTI_STAGE
from runner.job import Resolved
from runner.launcher import preemption
from runner.layouts.context.split import context_of
from runner.layouts.mesh_strategy import MeshStrategy
from runner.layouts.pipeline.probe import PipelineTrace
from runner.layouts.pipeline.stages import (
    SCHEDULES,
    by_whole_names,
    cast_output,
    in_context,
    sent_dtype,
    stage_examples,
    stage_module,
    stages_of,
    stream_split,
    with_dtypes,
)
from runner.layouts.probes import Schedule, Transfer
from runner.layouts.process_group import backend, timeout
from runner.layouts.sharded.accumulation import EachMicrobatchStage
from runner.layouts.sharded.shard import sixteen_bit
from runner.layouts.tensor.split import plan_of
from runner.losses import on_shards
from runner.metrics import TRAIN_LOSS, VAL_LOSS
from runner.models.sizes import stage_layers
from runner.models.spec import ModelSpec


class PipelineStrategy(MeshStrategy):
    strategy_name = "pipeline"

    def __init__(
        self,
        spec: ModelSpec,
        schedule: str,
        microbatches: int,
        layers: list[range],  # each stage's layers
        virtual: int,
        microbatch: tuple[int, int],  # samples per micro-batch, and tokens per sample (or 0)
        activations: torch.dtype,  # what autocast computes in: what stages send each other
        vocab_parallel: bool = False,  # parallel.vocab_parallel: the model's spec splits it
        sequence: bool = False,  # parallel.sequence_parallel: stages hand on the split stream
        **kw: Any,
    ):
        split = plan_of(spec, vocab_parallel, sequence)
        super().__init__(parallelize=split, sequence=sequence, expert_spec=spec, **kw)
        # The last stage's logits are split over the vocabulary: the schedule's loss and its
        # backward run under loss_parallel (runner/losses.py). Harmless for a model without one.
        self.sharded_loss = vocab_parallel and self.shape.tp > 1
        self.spec = spec
        self.schedule_name, self.microbatches, self.microbatch = schedule, microbatches, microbatch
        self.layers, self.virtual, self.activations = layers, virtual, activations
        # What stages hand each other: what the model's layers do (its spec says), 16 bits over
        # 16-bit weights
        wide = spec.fp32_stream and kw.get("policy") is None
        self.between = torch.float32 if wide else activations
        self.trace = PipelineTrace()
        self.schedule_record: Schedule | None = None  # the last step's, for the timing

    # --- where DDP would wrap the model: split it and build the schedule ---
    def configure_ddp(self) -> None:
        module = self.lightning_module
        module.automatic_optimization = False  # the schedule runs forward and backward
        full, n_stages, pp = module.model, len(self.layers), self.shape.pp
        if self.sharding is not None:
            self.sharding.find_units(full)
        self.stage_ids = stages_of(self.coords["pp"], pp, self.virtual)
        parts = [
            self.split_layers(stage_module(self.spec, full, s, self.layers)) for s in self.stage_ids
        ]
        pairs = list(zip(parts, self.stage_ids, strict=True))
        if self.activations != torch.float32:
            for part, s in pairs:
                in_context(part, self.precision_plugin.forward_context)  # autocast
                cast_output(part, sent_dtype(s, n_stages, self.between))
        self.stages = [self._stage(full, part, s) for part, s in pairs]
        self.named = by_whole_names(full, parts)
        module.model = nn.ModuleList(parts)  # this rank's parameters only: its optimizer's
        self.trace.instrument(self.stages)
        multi = self.schedule_name in MULTI_STAGE
        self.schedule = SCHEDULES[self.schedule_name](
            self.stages if multi else self.stages[0],
            n_microbatches=self.microbatches,
            loss_fn=module.loss_fn,
            scale_grads=False,  # scaled here, over what the optimizer steps (_mean_of_microbatches)
        )
        self.first, self.last = 0 in self.stage_ids, n_stages - 1 in self.stage_ids
        self.last_pp = (n_stages - 1) % pp  # the pp index of the rank holding the last stage
        # One stage (gradient accumulation) holds the tied weight once: nothing to sum.
        self.tied = self._tied_group() if self.spec.tied_ends and n_stages > 1 else None

    # --- the layout's answers (runner/layouts/layout.py) ---
    def last_schedule(self) -> Schedule | None:
        return self.schedule_record

    def state_module(self, model: nn.Module) -> nn.Module:
        """This rank's stages under the whole model's names (found as the stages were cut)."""
        return self.named

    def _stage(self, full: nn.Module, part: nn.Module, index: int) -> PipelineStage:
        """One stage over the pp dimension, its inputs' and outputs' shapes given up front."""
        n, between = len(self.layers), self.between
        examples = stage_examples(self.spec, full, index, self.layers, *self.microbatch)
        if self.split.sequence:
            examples = stream_split(examples, index == 0, index == n - 1, self.shape.tp)
        received = between if index > 0 else torch.float32  # the first stage reads the data
        # Gradient accumulation under ZeRO-3 resharding: each micro-batch as FSDP2 runs it
        each = self.sharding is not None and self.sharding.frees and n == 1
        return (EachMicrobatchStage if each else PipelineStage)(
            self.replicate(part),
            index,
            n,
            self.root_device,
            *with_dtypes(examples, received, sent_dtype(index, n, between)),
            group=self.device_mesh["pp"].get_group(),
        )

    def _tied_group(self) -> dist.ProcessGroup | None:
        """A model whose first and last layers share a weight (the decoder's embedding is its
        output layer): the first and last stage each hold a copy and sum their gradients every
        step (Megatron's embedding all-reduce), one group per (dp, cp, tp) position. Every rank
        takes part in creating every group."""
        mine, shape = None, self.shape
        for dp, cp, tp in itertools.product(range(shape.dp), range(shape.cp), range(shape.tp)):
            ends = [shape.rank(0, dp, tp, cp=cp), shape.rank(self.last_pp, dp, tp, cp=cp)]
            group = dist.new_group(ends)
            if self.global_rank in ends:
                mine = group
        return mine

    def _run_schedule(self, batch: Any, train: bool) -> torch.Tensor:
        x, y = batch
        losses: list[torch.Tensor] = []
        args = (x,) if self.first else ()
        kwargs = {"target": y, "losses": losses} if self.last else {}
        # Only the losses are wanted: kept, every micro-batch's output (the decoder's logits)
        # and their concatenation would hold twice the whole batch's output to the step's end.
        kwargs["return_outputs"] = False
        with on_shards(self.sharded_loss):
            (self.schedule.step if train else self.schedule.eval)(*args, **kwargs)
        return torch.stack(losses).mean() if losses else torch.zeros((), device=self.root_device)

    def _mean_of_microbatches(self, optimizer: Any) -> None:
        """The schedule sums the micro-batches' gradients; the batch's is their mean. Not the
        schedule's own scaling: it walks the stage's module, which, wrapped in DDP over tensor-
        parallel shards, lists none of the shards (runner/compat/ddp_dtensor.py), so their
        gradients stayed m times too large (hidden by AdamW, which ignores a gradient's scale)."""
        if self.microbatches == 1:
            return
        for group in optimizer.param_groups:
            for param in group["params"]:
                if param.grad is not None:
                    param.grad.div_(self.microbatches)

    def _sync_tied_embedding(self) -> list[Transfer]:
        if self.tied is None:
            return []
        part = self.lightning_module.model[0 if self.first else -1]
        start = clock.stamp()
        grad = self.held(self.spec.tied_weight(part)).grad
        # Split over the vocabulary, each tp rank sums its own rows' shard with its peer's.
        local = grad.to_local() if isinstance(grad, DTensor) else grad
        dist.all_reduce(local, group=self.tied)
        return [
            Transfer("pp", "all-reduce", start, clock.stamp(), local.numel() * local.element_size())
        ]

    def _from_last_stage(self, loss: torch.Tensor) -> tuple[torch.Tensor, list[Transfer]]:
        """Only the last stage computes the loss; every rank gets it (rank 0 logs it)."""
        if self.shape.pp == 1:  # one stage (gradient accumulation): every rank computed it
            return loss, []
        start = clock.stamp()
        c = self.coords
        src = self.shape.rank(self.last_pp, c["dp"], c["tp"], cp=c["cp"])
        dist.broadcast(loss, src=src, group=self.device_mesh["pp"].get_group())
        return loss, [Transfer("", "all-reduce", start, clock.stamp())]

    def _agree_on_stop(self) -> Transfer:
        """Whether any rank was asked to stop (runner/launcher/preemption.py), agreed by every
        rank: the schedule has no mean over ranks of its own to carry it."""
        start = clock.stamp()
        stop = torch.full((), float(preemption.requested()), device=self.root_device)
        dist.all_reduce(stop)
        self.lightning_module.stop_agreed = stop
        return Transfer("", "all-reduce", start, clock.stamp())

    def training_step(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        optimizer = self.lightning_module.optimizers()  # Lightning's wrapper counts the step
        optimizer.zero_grad()
        start = clock.stamp()
        loss = self._run_schedule(args[0], train=True)
        self._mean_of_microbatches(optimizer)
        self.experts.sync()  # a mixture of experts' placed experts: theirs, as DDP's for the rest
        syncs = self._sync_tied_embedding()
        window_end = clock.stamp()
        optimizer.step()
        optimizer_end = clock.stamp()
        loss, broadcast = self._from_last_stage(loss)
        broadcast.append(self._agree_on_stop())
        actions, sent, sends = self.trace.take()
        self.schedule_record = Schedule(
            (start, window_end),
            (window_end, optimizer_end),
            actions,
            [*syncs, *broadcast],
            sent + sum(t.nbytes for t in syncs),  # the tied weight's sum crosses pp's link too
            [*sends, *syncs],
        )
        # With data-parallel replicas (and context-parallel ranks), the mean of theirs: the loss
        # of the global batch.
        replicas = self.shape.size("dp") > 1
        self.lightning_module.log(TRAIN_LOSS.name, loss, prog_bar=True, sync_dist=replicas)
        return loss

    def validation_step(self, *args: Any, **kwargs: Any) -> None:
        loss, _ = self._from_last_stage(self._run_schedule(args[0], train=False))
        self.trace.take()  # evaluation is not part of any training step's timeline
        replicas = self.shape.size("dp") > 1
        self.lightning_module.log(VAL_LOSS.name, loss, prog_bar=True, sync_dist=replicas)


def strategy(cfg: DictConfig, r: Resolved) -> PipelineStrategy:
    p, mesh = cfg.parallel, r.mesh
    microbatch = cfg.data.batch_size // (mesh.dp * p.microbatches)
    return PipelineStrategy(
        r.spec,
        p.schedule,
        p.microbatches,
        stage_layers(cfg.model, p),
        p.virtual_stages,
        (microbatch, (cfg.data.get("seq_len") or 0) // mesh.cp),  # a cp rank's positions
        ACTIVATIONS[cfg.trainer.precision],
        p.vocab_parallel,
        p.sequence_parallel,
        shape=mesh,
        bucket_cap_mb=p.bucket_cap_mb,
        shard=p.shard,
        units=r.spec.recompute_units,
        context=context_of(cfg, r),
        policy=sixteen_bit(cfg.trainer.precision, cfg.trainer.grad_reduce, output=None),
        reshard_after_forward=p.reshard_after_forward,
        param_gather=p.param_gather,
        process_group_backend=backend(cfg),
        timeout=timeout(cfg),
    )
