"""The process group every multi-process layout forms: its backend and its timeout."""

from __future__ import annotations

from datetime import timedelta

from omegaconf import DictConfig


def backend(cfg: DictConfig) -> str:
    if cfg.dist.backend != "auto":
        return cfg.dist.backend
    return "nccl" if cfg.hardware.accelerator == "gpu" else "gloo"


def timeout(cfg: DictConfig) -> timedelta:
    return timedelta(seconds=cfg.dist.timeout_s)
