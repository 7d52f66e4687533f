"""Parallel layouts: each takes the plain model as it is and decides how it runs on many devices.

A layout is one module here exposing `strategy(cfg)`, the Lightning strategy that runs it; a new
layout is one new file and one line in LAYOUTS.
"""

from omegaconf import DictConfig
from pytorch_lightning.strategies import Strategy

from runner.cluster import world_size


def backend(cfg: DictConfig) -> str:
    return "nccl" if cfg.hardware.accelerator == "gpu" else "gloo"


def _data(cfg: DictConfig) -> Strategy:
    from runner.parallel import data

    return data.strategy(cfg)


LAYOUTS = {"data": _data}  # beside "none", the plain run


def strategy(cfg: DictConfig) -> Strategy | str:
    if world_size(cfg) == 1:
        return "auto"  # any layout on one device is the plain single-device run
    return LAYOUTS[cfg.parallel.name](cfg)
