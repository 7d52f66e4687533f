"""Build data, model and Trainer from a validated config and train: one rank's work.

Called once per process: by the launcher in-process for one device, by every spawned rank, or by
every process that torchrun or SLURM started. Only global rank 0 writes to MLflow.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig
from pytorch_lightning.loggers import MLFlowLogger
from pytorch_lightning.utilities import rank_zero_only
from torch.utils.data import DataLoader

from runner import layouts
from runner.compat.lightning import replace_sigterm_handling
from runner.compat.process_group import set_default_timeout
from runner.config.hardware import processes_per_host
from runner.config.logger import store_uri
from runner.data import Splits
from runner.data.sampling import ShardedBatchSampler
from runner.job import Resolved, resolved
from runner.launcher import preemption
from runner.launcher.allocator import keep_freed_memory
from runner.launcher.cluster import exit_on_sigterm, global_rank, world_size
from runner.launcher.threads import this_rank_threads
from runner.layouts.strategy import strategy
from runner.mesh import TRAFFIC_DIMS, Mesh
from runner.metrics import THROUGHPUT, TOKEN_THROUGHPUT, TRAIN_TIME
from runner.models.attention_kernel import use_attention_kernel
from runner.models.device_time import emulate_device_time
from runner.models.float8 import to_float8
from runner.models.recompute import recompute
from runner.models.spec import ModelSpec
from runner.planner.failures import priced
from runner.precision import precision_of
from runner.quiet import quiet_third_parties
from runner.snapshots import Snapshots, continues
from runner.training.callbacks.faults import FaultInjection, Progress
from runner.training.callbacks.progress_bar import ProgressBar
from runner.training.callbacks.rank_timing import LOOP_TIME, LoopTiming, RankTiming, combine
from runner.training.callbacks.router import RouterFigures
from runner.training.callbacks.system_metrics import SystemMetrics
from runner.training.module import TrainModule
from runner.validate import ConfigError


def set_process(cfg: DictConfig) -> None:
    """Threads per rank, unless hardware.threads_per_rank says: the cores a launcher bound this
    rank to (torchrun, srun --cpu-bind), else cores / ranks on this host (on an emulated network,
    every node's); on a crowded CPU timings mean nothing. And malloc keeping what a step frees for
    the next (runner/launcher/allocator.py)."""
    quiet_third_parties()
    hw = cfg.hardware
    threads = hw.threads_per_rank or this_rank_threads(processes_per_host(hw))
    torch.set_num_threads(threads)
    # Lightning's launcher sets its own (cores / a node's ranks) unless this says: on an emulated
    # network every node shares this host, and its ranks computed 2.5x slower
    os.environ["OMP_NUM_THREADS"] = str(threads)
    if cfg.hardware.keep_freed_memory:
        keep_freed_memory()


def loaders(
    splits: Splits, cfg: DictConfig, rank: int, world: int, start: int = 0
) -> tuple[DataLoader, DataLoader]:
    """This rank's shard of every global batch (data-parallel ranks differ, nothing else does),
    training from global batch `start` on (a resumed run)."""

    def loader(dataset: Any, shuffle: bool, start: int) -> DataLoader:
        batches = ShardedBatchSampler(
            len(dataset), cfg.data.batch_size, rank, world, shuffle, cfg.seed, start
        )
        # A generator of its own: by default every new iterator (each validation's) draws a seed
        # from the global RNG, which dropout uses, and a resumed run would draw out of turn.
        generator = torch.Generator().manual_seed(cfg.seed)
        return DataLoader(dataset, batch_sampler=batches, generator=generator)

    return loader(splits.train, True, start), loader(splits.val, False, 0)


WRITE_EVERY_S = 1.0  # how often rank 0 writes the losses logged meanwhile to MLflow


@contextlib.contextmanager
def sigterm_deferred() -> Iterator[None]:
    """SIGTERM's handler held back until the body is done, then run (CPython runs handlers in the
    main thread, between any two bytecodes: inside a database transaction, say)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[Any] = []
    handler = signal.signal(signal.SIGTERM, lambda *args: came.append(args))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, handler)
        if came and callable(handler):
            handler(*came[0])
        elif came and handler == signal.SIG_DFL:
            signal.raise_signal(signal.SIGTERM)


class StepLogger(MLFlowLogger):
    """MLflow's logger with two changes: steps count on from where a resumed run's snapshot left
    off, and writes are batched, one write to the store a second rather than one a step (a write
    to SQLite takes ~5 ms, a small model's step ~100 ms). What is pending is written when training
    ends, fails or is interrupted: Lightning finalizes its loggers then."""

    def __init__(self, *args: Any, step_offset: int = 0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.step_offset = step_offset
        self.pending: list[Any] = []
        self.written = time.monotonic()

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        from mlflow.entities import Metric

        now, step = int(time.time() * 1000), self.step_offset + (step or 0)
        self.pending += [Metric(k, float(v), now, step) for k, v in metrics.items()]
        if time.monotonic() - self.written >= WRITE_EVERY_S:
            self.write()

    @rank_zero_only
    def write(self) -> None:
        from mlflow.utils.validation import MAX_METRICS_PER_BATCH

        with sigterm_deferred():  # a handler raising mid-transaction would lose the batch
            for i in range(0, len(self.pending), MAX_METRICS_PER_BATCH):
                batch = self.pending[i : i + MAX_METRICS_PER_BATCH]
                self.experiment.log_batch(self.run_id, metrics=batch)
            self.pending, self.written = [], time.monotonic()

    @rank_zero_only
    def finalize(self, status: str = "success") -> None:
        self.write()
        super().finalize(status)


def cluster_environment() -> list[Any]:
    """Who told this rank its place. Ranks that torch's elastic launcher started (the runner's
    own, or torchrun's) read it from there, even inside a SLURM job (a sweep's job that SLURM gave
    one task, whose ranks the runner starts): Lightning would take SLURM's one task for the job.
    Under srun, Lightning's SLURM environment without its own requeue: it would answer the time
    limit's signal with a checkpoint and a requeue of its own, beside the runner's
    (runner/launcher/preemption.py)."""
    from pytorch_lightning.plugins.environments import SLURMEnvironment, TorchElasticEnvironment

    if TorchElasticEnvironment.detect():
        return [TorchElasticEnvironment()]
    return [SLURMEnvironment(auto_requeue=False)] if SLURMEnvironment.detect() else []


def build_trainer(
    cfg: DictConfig,
    r: Resolved,
    run_id: str | None,
    timing: LoopTiming,
    progress: str | None = None,
    resume: tuple[str, int] | None = None,
    extra: Sequence[pl.Callback] = (),
) -> pl.Trainer:
    t, (folder, start) = cfg.trainer, resume or (None, 0)
    uri = store_uri(cfg.logger.tracking_uri)
    spec = r.spec
    experts = spec is not None and spec.experts  # a mixture of experts' router
    logger = (  # only rank 0 logs: the others need no MLflow client (seconds of imports)
        StepLogger(tracking_uri=uri, run_id=run_id, step_offset=start)
        if run_id and global_rank() == 0
        else False
    )
    run_dir = Path(cfg.checkpoint.dir) / run_id if run_id else None
    snapshots = Snapshots(cfg, run_dir, start, Path(folder) if folder else None)
    return pl.Trainer(
        accelerator=cfg.hardware.accelerator,
        devices=cfg.hardware.devices,
        num_nodes=cfg.hardware.nodes,
        strategy=strategy(cfg, r),
        # Lightning's autocast (runner/precision.py); 16-bit weights are FSDP2's, not Lightning's
        precision="32-true" if precision_of(t).masters else t.precision,
        use_distributed_sampler=False,  # ShardedBatchSampler already shards by data-parallel rank
        max_steps=t.max_steps - start,
        max_epochs=-1,
        logger=logger,
        plugins=cluster_environment(),
        # The fault first: a rank that hangs at a step has not reached it. The snapshots before
        # the progress: a write that failed at a step's end ends the run before the next starts.
        callbacks=[
            FaultInjection(cfg.fault, start),
            snapshots,
            Progress(progress, start),
            timing,
            *([ProgressBar()] if t.progress_bar else []),
            *([RouterFigures(spec, cfg.model.n_layers, cfg.model.n_experts)] if experts else []),
            *(
                [SystemMetrics(run_id, uri, cfg.logger.system_metrics_interval_s)]
                if cfg.logger.system_metrics
                else []
            ),
            *extra,  # after the timing: a caller's own (mode=calibrate's plain step beside)
        ],  # fmt: skip
        log_every_n_steps=1,
        val_check_interval=t.val_every_n_steps,
        check_val_every_n_epoch=None,
        limit_val_batches=t.val_batches,
        num_sanity_val_steps=0,
        enable_checkpointing=False,
        enable_progress_bar=t.progress_bar,
        enable_model_summary=t.progress_bar,
        default_root_dir=os.getcwd(),
    )


def end_on_sigterm(trainer: pl.Trainer) -> None:
    """A rank that gets SIGTERM ends (runner.launcher.cluster.exit_on_sigterm), where Lightning
    would broadcast rank 0's flag before every step (runner/compat/lightning.py says why not). Every
    rank of a runner job gets SIGTERM itself, so no rank needs rank 0's flag."""
    replace_sigterm_handling(trainer, exit_on_sigterm)


def build_model(cfg: DictConfig, spec: ModelSpec | None) -> torch.nn.Module:
    model = instantiate(cfg.model, _convert_="all")
    # Before any layout takes the model: DDP, DTensor's splits and pipeline stages all run these
    # very units. A model of the user's (no spec) is left as it is.
    if spec is not None:
        recompute(spec.recompute_units(model), cfg.trainer.recompute)
    use_attention_kernel(model, cfg.trainer.attention)
    if cfg.trainer.precision == "fp8":  # before any layout: FSDP2 shards the float8 layers
        to_float8(model, cfg.trainer.fp8_recipe)
    emulate_device_time(model, cfg.hardware.emulated_linear_ms)
    if cfg.trainer.tf32:  # checked: a GPU with TF32 tensor cores
        torch.set_float32_matmul_precision("high")
    if cfg.trainer.compile:  # in place: the state dict keeps its keys, snapshots stay as they are
        model.compile()
    return model


def run_figures(
    cfg: DictConfig, mesh: Mesh, timing: LoopTiming, tokens_per_sample: int
) -> dict[str, float]:
    sizes = {dim: mesh.size(dim) for dim in TRAFFIC_DIMS}
    figures = combine([rank["figures"] for rank in timing.gathered], sizes)
    # Throughput from the loop's whole interval: data loading and logging count, validation not.
    loop = figures.pop(LOOP_TIME, None)
    if loop:
        figures[THROUGHPUT.name] = cfg.data.batch_size / loop
        if tokens_per_sample:
            figures[TOKEN_THROUGHPUT.name] = figures[THROUGHPUT.name] * tokens_per_sample
    return figures


def train(
    cfg: DictConfig,
    run_id: str | None = None,
    progress: str | None = None,
    resume: tuple[str, int] | None = None,
    callbacks: Sequence[pl.Callback] = (),
) -> dict[str, float]:
    """Train; on rank 0 with a run, log the summary figures and the timeline picture. The job is
    resolved here, once, and what the rank builds takes it. `callbacks`: a caller's own, after the
    runner's."""
    r = resolved(cfg)
    set_process(cfg)
    preemption.listen()
    pl.seed_everything(cfg.seed, workers=True, verbose=False)  # identical weights on every rank
    splits: Splits = instantiate(cfg.data, _convert_="all")
    module = TrainModule(
        build_model(cfg, r.spec),
        cfg.data.loss,
        cfg.trainer.optimizer,
        cfg.trainer.lr,
        cfg.trainer.weight_decay,
    )
    timing = (RankTiming if cfg.trainer.measure else LoopTiming)(
        cfg.trainer.warmup_steps,
        cuda=cfg.hardware.accelerator == "gpu",
        profile_every=cfg.trainer.profile_every_n_steps,
    )
    set_default_timeout(cfg.dist.timeout_s)
    trainer = build_trainer(cfg, r, run_id, timing, progress, resume, callbacks)
    end_on_sigterm(trainer)
    shard = layouts.data_shard(r.mesh, trainer.global_rank)
    train_loader, val_loader = loaders(splits, cfg, *shard, start=resume[1] if resume else 0)
    if len(train_loader) == 0:
        raise ConfigError(
            "data.batch_size",
            f"{cfg.data.batch_size} is more than the {len(splits.train)} training samples",
        )
    if run_id and trainer.global_rank == 0 and not (resume and continues(cfg, Path(resume[0]))):
        from runner.training.record import record_data

        record_data(cfg, run_id, splits)
    start = time.perf_counter()
    trainer.fit(module, train_loader, val_loader)
    figures = run_figures(cfg, r.mesh, timing, splits.tokens_per_sample)
    figures[TRAIN_TIME.name] = time.perf_counter() - start
    figures |= priced(cfg.hardware, world_size(cfg), figures[TRAIN_TIME.name])
    if run_id and trainer.global_rank == 0:
        from runner.training.record import record_training

        record_training(cfg, r, run_id, figures, timing.gathered)
    return figures
