"""Parallel layouts: each takes the plain model as it is and decides how it runs on many devices.

A layout is one folder: its Lightning strategy, the probe that measures what it runs, and the
traffic the planner predicts for it. The device mesh (runner/mesh.py) says which runs: data-
parallel replicas only is Lightning's DDP (data/); any tensor-parallel split, or replicas that
shard their state (sharded/), is the mesh strategy (tensor/); any pipeline is the pipeline
strategy (pipeline/), which also splits its stages over tp and replicates them over dp. This
module stays torch-free: the planner imports it.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from omegaconf import DictConfig

from runner.job import Job
from runner.layouts.data import traffic as data_traffic
from runner.layouts.pipeline import traffic as pipeline_traffic
from runner.layouts.sharded import traffic as sharded_traffic
from runner.layouts.tensor import traffic as tensor_traffic
from runner.layouts.traffic import Traffic
from runner.mesh import mesh_of

# DDP's all-reduce (parallel.shard none, optimizer) and the sharded levels' own collectives add
# up on dp.
TRAFFIC = (
    data_traffic.traffic,
    sharded_traffic.traffic,
    tensor_traffic.traffic,
    pipeline_traffic.traffic,
)


def traffic(job: Job) -> Traffic:
    """Every dimension's traffic for the job's mesh, at the job's precision: the layouts' sums."""
    out = Traffic()
    for part in TRAFFIC:
        found = part(job)
        for mine, theirs in (
            (out.payload, found.payload),
            (out.calls, found.calls),
            (out.by_collective, found.by_collective),
        ):
            for key, value in theirs.items():
                mine[key] = mine.get(key, 0.0) + value
        out.tail |= found.tail
    return out


def backend(cfg: DictConfig) -> str:
    if cfg.dist.backend != "auto":
        return cfg.dist.backend
    return "nccl" if cfg.hardware.accelerator == "gpu" else "gloo"


def timeout(cfg: DictConfig) -> timedelta:
    return timedelta(seconds=cfg.dist.timeout_s)


def data_shard(cfg: DictConfig, rank: int) -> tuple[int, int]:
    """This rank's data-parallel index and count: only data-parallel ranks see different data."""
    mesh = mesh_of(cfg)
    return mesh.coords(rank)["dp"], mesh.dp


def strategy(cfg: DictConfig) -> Any:
    """The Lightning strategy of the config's layout ("auto": one device, no layout). Micro-batches
    without a pipeline are gradient accumulation: the pipeline strategy with one stage, whose
    schedule runs forward and backward per micro-batch (on one process too)."""
    mesh = mesh_of(cfg)
    accumulate = cfg.parallel.microbatches > 1
    sharded = cfg.parallel.shard != "none" and mesh.dp > 1
    if mesh.world == 1 and not accumulate:
        return "auto"  # any layout on one device is the plain single-device run
    if mesh.pp > 1 or accumulate:
        from runner.layouts.pipeline.strategy import strategy as make
    elif mesh.tp > 1 or sharded:
        from runner.layouts.tensor.strategy import strategy as make
    else:
        from runner.layouts.data.strategy import strategy as make
    return make(cfg, mesh)
