"""Predictions from formulas, logged as `pred/...` beside what a run measures.

The seed's and nccl-tests' arithmetic: payload S per collective call; a ring all-reduce moves
2(n-1)/n * S per rank; data parallelism all-reduces every trainable gradient once per step.
"""

from __future__ import annotations

from omegaconf import DictConfig

from runner.models.sizes import param_count

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


def predict(cfg: DictConfig, world: int) -> dict[str, float]:
    return data_parallel(cfg, world)
