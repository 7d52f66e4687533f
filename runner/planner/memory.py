"""Memory per device: weights, gradients, optimizer state and activations, on the busiest rank.

Weights and gradients at the training dtype; AdamW keeps two fp32 moments (and, with bf16, an
fp32 master copy of the weights: mixed precision). Decoder activations per layer and micro-batch
as Korthikanti et al. (2022) count them without recomputation: s*b*h*(34 + 5*a*s/h) bytes at
16 bits, tensor parallelism dividing all but 10 of the 34 (s*b*h*(10 + 24/t + 5*a*s/(h*t))),
plus the logits; with full recomputation (plan.recompute) only each layer's input, s*b*h values,
and one layer's whole set at a time. The first pipeline stage holds min(m, p) micro-batches in
flight under 1F1B, all m under GPipe.
"""

from __future__ import annotations

from omegaconf import DictConfig

from runner.mesh import Mesh, mesh_of
from runner.models.sizes import stage_layers
from runner.planner.traffic import decoder_block_params, is_decoder, stage_params, widths

DTYPE_BYTES = {"fp32": 4, "bf16": 2}
GIB = 2**30


def optimizer_bytes_per_param(cfg: DictConfig, dtype: str) -> int:
    moments = 8 if cfg.trainer.optimizer == "adamw" else 0
    master = 4 if dtype == "bf16" else 0
    return moments + master


def params_per_device(cfg: DictConfig, mesh: Mesh) -> int:
    """The most any rank holds: its stages' parameters, tensor-parallel layers split."""
    stages = stage_layers(cfg.model, cfg.parallel)
    last = len(stages) - 1
    counts = [
        stage_params(cfg.model, s, i in (0, last), mesh.tp) or 0 for i, s in enumerate(stages)
    ]
    return max(sum(counts[r :: mesh.pp]) for r in range(mesh.pp))  # stage s sits on rank s % pp


def in_flight(cfg: DictConfig, mesh: Mesh) -> int:
    m = cfg.parallel.microbatches if mesh.pp > 1 else 1
    return m if cfg.parallel.schedule == "gpipe" else min(m, mesh.pp * cfg.parallel.virtual_stages)


def activation_bytes(cfg: DictConfig, mesh: Mesh, dtype: str) -> float:
    m, elem = cfg.model, DTYPE_BYTES[dtype]
    micro = cfg.data.batch_size // (mesh.dp * (cfg.parallel.microbatches if mesh.pp > 1 else 1))
    layers = max(len(s) for s in stage_layers(m, cfg.parallel))
    if is_decoder(m):
        s, h, a, t = cfg.data.seq_len, m.d_model, m.n_heads, mesh.tp
        per_layer = s * micro * h * (10 + 24 / t + 5 * a * s / (h * t)) * elem / 2
        logits = s * micro * m.vocab_size * 4  # fp32 for the loss, on the last stage
        if cfg.plan.recompute:
            return in_flight(cfg, mesh) * layers * s * micro * h * elem + per_layer + logits
        return in_flight(cfg, mesh) * (layers * per_layer) + logits
    if not m.get("_target_", "").endswith("FFNN"):
        return 0.0  # a neuron: nothing worth counting
    return in_flight(cfg, mesh) * 2 * micro * sum(widths(m)) * elem  # each layer's in and out


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
    m, dtype, tp = cfg.model, cfg.plan.dtype, cfg.parallel.tp or 1
    if is_decoder(m):
        params = max(decoder_block_params(m.d_model, tp), m.vocab_size * m.d_model)
    elif m.get("_target_", "").endswith("FFNN"):
        w = widths(m)
        params = max(a * b + b for a, b in zip(w[:-1], w[1:], strict=True))
    else:
        params = 0
    per_param = 2 * DTYPE_BYTES[dtype] + optimizer_bytes_per_param(cfg, dtype)
    return params * per_param / GIB
