"""Predictions from formulas, logged as `pred/...` beside what a run measures.

The seed's and nccl-tests' arithmetic: payload S per collective call; a ring all-reduce moves
2(n-1)/n * S per rank; data parallelism all-reduces every trainable gradient once per step.
"""

from __future__ import annotations

from omegaconf import DictConfig

from runner.models.sizes import balanced_split, param_count, pipeline_layers

FP32_BYTES = 4


def ring_allreduce_bytes(payload: float, n: int) -> float:
    """Bytes each rank sends (and receives) in a ring all-reduce of `payload` bytes over n ranks."""
    return 2 * (n - 1) / n * payload


def data_parallel(cfg: DictConfig, world: int) -> dict[str, float]:
    params = param_count(cfg.model)
    if cfg.parallel.name != "data" or world < 2 or params is None:
        return {}
    payload = params * FP32_BYTES
    return {
        "pred/comm_bytes_per_step/dp": payload,
        "pred/ring_bytes_per_step/dp": ring_allreduce_bytes(payload, world),
    }


def bubble_fraction(stages: int, microbatches: int, virtual: int = 1) -> float:
    """Idle share of a pipeline step: (p - 1) / (v*m + p - 1), p stages, m micro-batches."""
    return (stages - 1) / (virtual * microbatches + stages - 1)


def boundary_elements(cfg: DictConfig, split: list[int]) -> list[int]:
    """Elements of one sample's activation crossing each boundary between stages."""
    m = cfg.model
    cuts = [sum(split[: s + 1]) for s in range(len(split) - 1)]
    if m._target_.endswith("Decoder"):
        return [cfg.data.seq_len * m.d_model for _ in cuts]
    widths = [m.in_features, *m.hidden, m.out_features]
    return [widths[cut] for cut in cuts]


def pipeline(cfg: DictConfig, world: int) -> dict[str, float]:
    if cfg.parallel.name != "pipeline" or world < 2:
        return {}
    p = cfg.parallel
    stages = world * p.virtual_stages
    split = list(p.split) if p.split else balanced_split(pipeline_layers(cfg.model), stages)
    # Each boundary carries every sample's activation forward and its gradient back, once.
    total = sum(2 * cfg.data.batch_size * n * FP32_BYTES for n in boundary_elements(cfg, split))
    return {
        "bubble_fraction_theory": bubble_fraction(world, p.microbatches, p.virtual_stages),
        "pred/comm_bytes_per_step/pp": total / world,  # sent per rank, mean over ranks
    }


def predict(cfg: DictConfig, world: int) -> dict[str, float]:
    return data_parallel(cfg, world) | pipeline(cfg, world)
