"""Emulated device time: every Linear layer's forward takes a fixed time more, its backward twice
that, during which the host's thread sleeps (`hardware.emulated_linear_ms`).

What a GPU does to its host: the device computes while the process waits. On a CPU host with
fewer cores than ranks (the seed's pipeline: 4 stages on 2 cores), ranks that compute take turns
on the cores, and each one's wall time holds the others' work; ranks that sleep do not, so their
schedule keeps the shape its theory describes. Backward takes twice forward's time: two products
(the input's gradient and the weight's) against forward's one.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn


class _Wait(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, seconds: float) -> torch.Tensor:
        time.sleep(seconds)
        ctx.seconds = seconds
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        time.sleep(2 * ctx.seconds)
        return grad, None


def emulate_device_time(model: nn.Module, linear_ms: float | None) -> int:
    """Every Linear of `model` waits linear_ms in forward, twice in backward; how many it holds."""
    if not linear_ms:
        return 0
    seconds = linear_ms / 1000
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    for linear in linears:
        linear.register_forward_hook(lambda _m, _inputs, out: _Wait.apply(out, seconds))
    return len(linears)
