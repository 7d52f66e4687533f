"""Memory per device: weights, gradients, optimizer state and activations, on the busiest rank.

Weights and gradients at the training dtype; AdamW keeps two fp32 moments (and, with bf16, an
fp32 master copy of the weights: mixed precision). Activations as the model's spec counts them
(the decoder's: Korthikanti et al. 2022) for the micro-batches a stage holds in flight: the first
pipeline stage holds min(m, p) micro-batches under 1F1B, all m under GPipe.
"""

from __future__ import annotations

from omegaconf import DictConfig

from runner.mesh import Mesh, mesh_of
from runner.models.registry import spec_for
from runner.models.sizes import stage_layers
from runner.models.spec import Activations

DTYPE_BYTES = {"fp32": 4, "bf16": 2}
GIB = 2**30


def optimizer_bytes_per_param(cfg: DictConfig, dtype: str) -> int:
    moments = 8 if cfg.trainer.optimizer == "adamw" else 0
    master = 4 if dtype == "bf16" else 0
    return moments + master


def params_per_device(cfg: DictConfig, mesh: Mesh) -> int:
    """The most any rank holds: its stages' parameters, tensor-parallel layers split."""
    spec, stages = spec_for(cfg.model), stage_layers(cfg.model, cfg.parallel)
    last = len(stages) - 1
    counts = [
        sum(spec.stage_tensors(cfg.model, s, i in (0, last), mesh.tp)) for i, s in enumerate(stages)
    ]
    return max(sum(counts[r :: mesh.pp]) for r in range(mesh.pp))  # stage s sits on rank s % pp


def in_flight(cfg: DictConfig, mesh: Mesh) -> int:
    m = cfg.parallel.microbatches if mesh.pp > 1 else 1
    return m if cfg.parallel.schedule == "gpipe" else min(m, mesh.pp * cfg.parallel.virtual_stages)


def activation_bytes(cfg: DictConfig, mesh: Mesh, dtype: str) -> float:
    micro = cfg.data.batch_size // (mesh.dp * (cfg.parallel.microbatches if mesh.pp > 1 else 1))
    held = Activations(
        micro=micro,
        seq_len=cfg.data.get("seq_len", 0),
        layers=max(len(s) for s in stage_layers(cfg.model, cfg.parallel)),
        in_flight=in_flight(cfg, mesh),
        tp=mesh.tp,
        elem=DTYPE_BYTES[dtype],
        recompute=cfg.plan.recompute,
    )
    return spec_for(cfg.model).activation_bytes(cfg.model, held)


def memory_per_device_gib(cfg: DictConfig, dtype: str) -> dict[str, float]:
    mesh = mesh_of(cfg)
    params, elem = params_per_device(cfg, mesh), DTYPE_BYTES[dtype]
    out = {
        "weights": params * elem / GIB,
        "gradients": params * elem / GIB,
        "optimizer_state": params * optimizer_bytes_per_param(cfg, dtype) / GIB,
        "activations": activation_bytes(cfg, mesh, dtype) / GIB,
    }
    return out | {"total": sum(out.values())}


def largest_layer_gib(cfg: DictConfig) -> float:
    """One layer (a block, the embedding, or a Linear), as tensor parallelism splits it, with its
    gradients and optimizer state: the least any device must hold."""
    dtype, tp = cfg.plan.dtype, cfg.parallel.tp or 1
    params = spec_for(cfg.model).largest_layer_params(cfg.model, tp)
    per_param = 2 * DTYPE_BYTES[dtype] + optimizer_bytes_per_param(cfg, dtype)
    return params * per_param / GIB
