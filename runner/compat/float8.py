"""torch's float8 matrix product, `torch._scaled_mm` (private): what torchao's float8 layers run,
timed alone by mode=calibrate for `hardware.peak_tflops.fp8`. Checked on torch 2.13 (its CPU
build takes float8 too) and 2.11 (CUDA, compute capability 8.9 on)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from runner.compat import private

CHECKED = "2.13"


def float8_product(n: int, device: torch.device) -> Callable[[], torch.Tensor]:
    """An n x n x n product of float8 (e4m3) matrices, unit scales, bf16 out, as a call."""
    scaled_mm = private(torch, "_scaled_mm", "torch", "torch", CHECKED)
    a = torch.randn(n, n, device=device).to(torch.float8_e4m3fn)
    b = torch.randn(n, n, device=device).to(torch.float8_e4m3fn).t()  # column-major, as it takes
    one = torch.ones((), device=device)
    return lambda: scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
