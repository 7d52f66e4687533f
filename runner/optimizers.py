"""Optimizers by the names the trainer config gives them (runner.choices.OPTIMIZERS)."""

from collections.abc import Sequence
from typing import Any

import torch

OPTIMIZERS: dict[str, type[torch.optim.Optimizer]] = {
    "adamw": torch.optim.AdamW,
    "sgd": torch.optim.SGD,
}

try:
    from torch.distributed.tensor import DTensor
except ImportError:  # a torch built without distributed support has no DTensor to exclude
    DTensor = None  # type: ignore[assignment,misc]


def options(name: str, params: Sequence[Any]) -> dict[str, Any]:
    """Keyword arguments for OPTIMIZERS[name] beyond lr and weight decay.

    AdamW over parameters that all live on a GPU takes torch's fused kernel: one launch updates
    every parameter, where the default foreach path launches several per step. On CPU, or with
    any parameter elsewhere, torch's default is kept (fused would refuse a mixed list).
    DTensor parameters (tensor parallelism) stay on the default path too: torch 2.13 registers
    sharding rules for _fused_adamw_, but the GPU machines run 2.11 and that combination has not
    been run there.
    """
    if name != "adamw" or not params:
        return {}
    if DTensor is not None and any(isinstance(p, DTensor) for p in params):
        return {}
    return {"fused": True} if all(p.is_cuda for p in params) else {}
