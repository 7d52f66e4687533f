"""Parallel layouts: each takes the plain model as it is and decides how it runs on many devices.

A layout is one module here exposing `strategy(cfg)`, the Lightning strategy that runs it; a new
layout is one new file and one line in LAYOUTS.
"""

from omegaconf import DictConfig
from pytorch_lightning.strategies import Strategy


def backend(cfg: DictConfig) -> str:
    return "nccl" if cfg.hardware.accelerator == "gpu" else "gloo"


def strategy(cfg: DictConfig) -> Strategy | str:
    from runner.parallel import data

    if cfg.hardware.devices * cfg.hardware.nodes == 1:
        return "auto"  # every layout of one device is the plain single-device run
    layouts = {"data": data.strategy}
    return layouts[cfg.parallel.name](cfg)
