"""One artificial neuron: z = w . x + w0 (the bias weight, its input fixed at 1), y_hat = f(z)."""

import torch
from torch import nn

from runner.models.activations import activation as make_activation


class Neuron(nn.Module):
    def __init__(self, n_inputs: int, activation: str = "sigmoid") -> None:
        super().__init__()
        self.linear = nn.Linear(n_inputs, 1)  # weight = w1..wn, bias = w0
        self.act = make_activation(activation)

    def weighted_sum(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.weighted_sum(x))
