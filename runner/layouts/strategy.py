"""The Lightning strategy a job's mesh runs with: one device's plain run, Lightning's DDP for
replicas alone, the mesh strategy for a tensor or context split or sharded replicas, the pipeline
strategy for stages (or micro-batches on their own: gradient accumulation)."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from runner.job import Resolved
from runner.precision import precision_of


def strategy(cfg: DictConfig, r: Resolved) -> Any:
    """The Lightning strategy of the config's layout ("auto": one device, no layout). Micro-batches
    without a pipeline are gradient accumulation: the pipeline strategy with one stage, whose
    schedule runs forward and backward per micro-batch (on one process too)."""
    mesh = r.mesh
    accumulate = cfg.parallel.microbatches > 1
    # 16-bit weights over fp32 masters: FSDP2's mixed precision, one process's too
    masters = precision_of(cfg.trainer).masters
    sharded = (cfg.parallel.shard != "none" and mesh.dp > 1) or masters
    if mesh.world == 1 and not accumulate and not masters:
        return "auto"  # any layout on one device is the plain single-device run
    if mesh.pp > 1 or accumulate:
        from runner.layouts.pipeline.strategy import strategy as make
    elif mesh.tp > 1 or mesh.cp > 1 or mesh.ep > 1 or sharded:
        from runner.layouts.mesh_strategy import strategy as make
    else:
        from runner.layouts.data.strategy import strategy as make
    return make(cfg, r)
