"""torch's side of runner/precision.py: the dtype autocast computes in, and its context for loops
the runner writes itself (the plain loop of mode=calibrate and the benchmarks)."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import torch

# What each of runner.choices.PRECISIONS computes activations in (a test checks the keys).
ACTIVATIONS = {"32-true": torch.float32, "bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}


def autocast(precision: str, device: torch.device) -> AbstractContextManager:
    """Lightning's mixed precision as a plain context: matmuls in 16 bits, weights fp32."""
    dtype = ACTIVATIONS[precision]
    if dtype == torch.float32:
        return nullcontext()
    return torch.autocast(device.type, dtype=dtype)
