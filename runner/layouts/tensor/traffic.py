"""Tensor parallelism's traffic: the model's spec counts the activations its split layers
all-reduce per sample (Megatron: 2 of b*s*h forward and 2 backward per block); a replica's
micro-batches run them all; each stage's shards carry their own layers' share."""

from __future__ import annotations

from omegaconf import DictConfig

from runner.layouts.traffic import Traffic
from runner.mesh import Mesh
from runner.models.spec import ModelSpec


def traffic(
    cfg: DictConfig, spec: ModelSpec, mesh: Mesh, stages: list[range], elem: int
) -> Traffic:
    if mesh.tp < 2:
        return Traffic()
    samples = cfg.data.batch_size // mesh.dp  # a replica's, over its micro-batches
    microbatches = cfg.parallel.microbatches if mesh.pp > 1 else 1
    elements, calls = spec.tp_traffic(cfg.model, cfg.data, samples, stages, microbatches)
    return Traffic({"tp": elements * elem / mesh.pp}, {"tp": calls / mesh.pp})
