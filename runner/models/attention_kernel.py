"""trainer.attention=math: every attention of the model through torch's SDPA math path, the
whole s x s square of scores computed and kept for backward (what Megatron-LM ran before flash
attention, and what runs beside a fused kernel's published rates). auto leaves SDPA to pick."""

from __future__ import annotations

from typing import Any

import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel


def math_attention(*args: Any, **kwargs: Any) -> Any:
    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(*args, **kwargs)


def use_attention_kernel(model: nn.Module, kernel: str) -> None:
    """Point each attention that calls SDPA (an `attend` of the decoder's) at `kernel`'s."""
    if kernel != "math":
        return
    for module in model.modules():
        if getattr(module, "attend", None) is F.scaled_dot_product_attention:
            module.attend = math_attention
