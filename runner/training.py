"""Build data, model and Trainer from a validated config, and train on one process."""

from __future__ import annotations

import os

import pytorch_lightning as pl
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig
from pytorch_lightning.loggers import MLFlowLogger
from torch.utils.data import DataLoader

from runner.callbacks.step_timer import StepTimer
from runner.data import Splits
from runner.lit_module import TrainModule
from runner.tracking import Run


def set_threads(cfg: DictConfig, ranks: int) -> None:
    """Threads per rank = cores / ranks, or the timings of a crowded CPU mean nothing."""
    cores = len(os.sched_getaffinity(0))
    torch.set_num_threads(cfg.hardware.threads_per_rank or max(1, cores // ranks))


def loaders(splits: Splits, cfg: DictConfig) -> tuple[DataLoader, DataLoader]:
    shuffle = torch.Generator().manual_seed(cfg.seed)
    batch = cfg.data.batch_size
    train = DataLoader(
        splits.train, batch_size=batch, shuffle=True, drop_last=True, generator=shuffle
    )
    return train, DataLoader(splits.val, batch_size=batch)


def build_trainer(cfg: DictConfig, run: Run | None, timer: StepTimer) -> pl.Trainer:
    t = cfg.trainer
    logger = MLFlowLogger(tracking_uri=cfg.logger.tracking_uri, run_id=run.run_id) if run else False
    return pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=t.max_steps,
        max_epochs=-1,
        logger=logger,
        callbacks=[timer],
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


def train(cfg: DictConfig, run: Run | None = None) -> dict[str, float]:
    """Train; return the summary figures (also logged to the run, when there is one)."""
    set_threads(cfg, ranks=1)
    pl.seed_everything(cfg.seed, workers=True, verbose=False)
    splits: Splits = instantiate(cfg.data, _convert_="all")
    module = TrainModule(
        instantiate(cfg.model, _convert_="all"),
        cfg.data.loss,
        cfg.trainer.optimizer,
        cfg.trainer.lr,
        cfg.trainer.weight_decay,
    )
    timer = StepTimer(cfg.data.batch_size, splits.tokens_per_sample, cfg.trainer.warmup_steps)
    trainer = build_trainer(cfg, run, timer)
    trainer.fit(module, *loaders(splits, cfg))
    return timer.summary()
