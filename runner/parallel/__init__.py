"""Parallel layouts: each takes the plain model as it is and decides how it runs on many devices.

The device mesh (runner/mesh.py) says which: data-parallel replicas only is Lightning's DDP; any
tensor-parallel split is the mesh strategy (plugins/mesh_strategy.py); any pipeline is the pipeline
strategy, which also splits its stages over tp and replicates them over dp.
"""

from datetime import timedelta

from omegaconf import DictConfig
from pytorch_lightning.strategies import Strategy

from runner.mesh import Mesh, mesh_of
from runner.models.sizes import stage_layers


def backend(cfg: DictConfig) -> str:
    return "nccl" if cfg.hardware.accelerator == "gpu" else "gloo"


def timeout(cfg: DictConfig) -> timedelta:
    return timedelta(seconds=cfg.dist.timeout_s)


def set_default_timeout(cfg: DictConfig) -> None:
    """Groups made after the world's (the mesh's dimensions, the tied embedding's) take torch's
    module default (30 minutes), not the world's timeout: make that default the config's too."""
    from torch.distributed import distributed_c10d

    distributed_c10d.default_pg_timeout = timeout(cfg)
    distributed_c10d.default_pg_nccl_timeout = timeout(cfg)


def _data(cfg: DictConfig, mesh: Mesh) -> Strategy:
    from runner.parallel import data

    return data.strategy(cfg)


def _tensor(cfg: DictConfig, mesh: Mesh) -> Strategy:
    from plugins.mesh_strategy import MeshStrategy

    return MeshStrategy(
        mesh, cfg.parallel.bucket_cap_mb, process_group_backend=backend(cfg), timeout=timeout(cfg)
    )


def _pipeline(cfg: DictConfig, mesh: Mesh) -> Strategy:
    from plugins.pipeline_strategy import PipelineStrategy

    p = cfg.parallel
    split = [len(layers) for layers in stage_layers(cfg.model, p)]
    microbatch = cfg.data.batch_size // (mesh.dp * p.microbatches)
    return PipelineStrategy(
        p.schedule,
        p.microbatches,
        split,
        p.virtual_stages,
        (microbatch, cfg.data.get("seq_len", 0)),
        shape=mesh,
        bucket_cap_mb=p.bucket_cap_mb,
        process_group_backend=backend(cfg),
        timeout=timeout(cfg),
    )


def data_shard(cfg: DictConfig, rank: int) -> tuple[int, int]:
    """This rank's data-parallel index and count: only data-parallel ranks see different data."""
    mesh = mesh_of(cfg)
    return mesh.coords(rank)["dp"], mesh.dp


def strategy(cfg: DictConfig) -> Strategy | str:
    mesh = mesh_of(cfg)
    if mesh.world == 1:
        return "auto"  # any layout on one device is the plain single-device run
    if mesh.pp > 1:
        return _pipeline(cfg, mesh)
    return (_tensor if mesh.tp > 1 else _data)(cfg, mesh)
