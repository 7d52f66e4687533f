"""How the FFNN splits into pipeline stages: a Linear layer and its activation per layer, the very
modules the whole model trains (nothing copied)."""

from __future__ import annotations

import torch
from torch import nn

from runner.models.ffnn.model import FFNN


def stage_module(model: FFNN, layers: range) -> nn.Module:
    return nn.Sequential(*(model.layers[j] for i in layers for j in (2 * i, 2 * i + 1)))


def stage_example(
    model: FFNN, layers: range, first: bool, microbatch: int
) -> tuple[torch.Tensor, torch.Tensor]:
    linears = [m for m in model.layers if isinstance(m, nn.Linear)]
    width_in, width_out = linears[layers.start].in_features, linears[layers.stop - 1].out_features
    x = torch.empty(microbatch, width_in, device="meta", requires_grad=not first)
    return x, torch.empty(microbatch, width_out, device="meta", requires_grad=True)
