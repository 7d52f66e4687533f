"""A pipeline's traffic and bubble: each boundary carries every sample's activation forward and its
gradient back, once; every tensor-parallel rank of a stage sends its own copy."""

from __future__ import annotations

from omegaconf import DictConfig

from runner.layouts.traffic import Traffic
from runner.mesh import Mesh
from runner.models.spec import ModelSpec


def bubble_fraction(stages: int, microbatches: int, virtual: int = 1) -> float:
    """Idle share of a pipeline step: (p - 1) / (v*m + p - 1), p stages, m micro-batches."""
    return (stages - 1) / (virtual * microbatches + stages - 1)


def pipeline_bubble(cfg: DictConfig, mesh: Mesh) -> float:
    if mesh.pp < 2:
        return 0.0
    p = cfg.parallel
    return bubble_fraction(mesh.pp, p.microbatches, p.virtual_stages)


def traffic(
    cfg: DictConfig, spec: ModelSpec, mesh: Mesh, stages: list[range], elem: int
) -> Traffic:
    if mesh.pp < 2:
        return Traffic()
    boundaries = spec.boundary_elements(cfg.model, cfg.data, stages)
    total = sum(2 * cfg.data.batch_size * n * elem for n in boundaries)
    sends = 2 * cfg.parallel.microbatches * len(boundaries)  # per replica and shard
    return Traffic({"pp": total / (mesh.pp * mesh.dp)}, {"pp": sends / mesh.pp})
