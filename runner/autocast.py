"""torch's side of runner/precision.py: the dtype autocast computes in, and its context for loops
the runner writes itself (the plain loop of mode=calibrate and the benchmarks)."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import torch

from runner.precision import BY_NAME

# What each of runner.choices.PRECISIONS computes activations in (a test checks the keys).
ACTIVATIONS = {
    "32-true": torch.float32,
    "bf16-mixed": torch.bfloat16,
    "16-mixed": torch.float16,
    "bf16-true": torch.bfloat16,  # 16-bit weights: no autocast, the layers' own dtype
    "fp8": torch.bfloat16,
}


def autocast(precision: str, device: torch.device) -> AbstractContextManager:
    """Lightning's mixed precision as a plain context: matmuls in 16 bits, weights fp32."""
    if precision == "32-true":
        return nullcontext()
    if not BY_NAME[precision].mixed:  # validation refuses to train them (runner/config/trainer.py)
        raise ValueError(f"{precision} is 16-bit weights, not autocast")
    return torch.autocast(device.type, dtype=ACTIVATIONS[precision])
