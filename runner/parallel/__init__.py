"""Parallel layouts: each takes the plain model as it is and decides how it runs on many devices.

A layout is one module here exposing `strategy(cfg)`, the Lightning strategy that runs it; a new
layout is one new file and one line in LAYOUTS.
"""

from omegaconf import DictConfig
from pytorch_lightning.strategies import Strategy

from runner.cluster import world_size
from runner.models.sizes import balanced_split, pipeline_layers


def backend(cfg: DictConfig) -> str:
    return "nccl" if cfg.hardware.accelerator == "gpu" else "gloo"


def _data(cfg: DictConfig) -> Strategy:
    from runner.parallel import data

    return data.strategy(cfg)


def _pipeline(cfg: DictConfig) -> Strategy:
    from plugins.pipeline_strategy import PipelineStrategy

    p, stages = cfg.parallel, world_size(cfg) * cfg.parallel.virtual_stages
    split = list(p.split) if p.split else balanced_split(pipeline_layers(cfg.model), stages)
    return PipelineStrategy(
        p.schedule, p.microbatches, split, p.virtual_stages, process_group_backend=backend(cfg)
    )


LAYOUTS = {"data": _data, "pipeline": _pipeline}  # beside "none", the plain run


def data_shard(cfg: DictConfig, rank: int, world: int) -> tuple[int, int]:
    """This rank's data-parallel index and count: only data-parallel ranks see different data."""
    return (rank, world) if cfg.parallel.name == "data" else (0, 1)


def strategy(cfg: DictConfig) -> Strategy | str:
    if world_size(cfg) == 1:
        return "auto"  # any layout on one device is the plain single-device run
    return LAYOUTS[cfg.parallel.name](cfg)
