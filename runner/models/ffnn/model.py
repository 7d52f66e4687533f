"""A feed-forward network: Linear layers of the given widths, an activation after each."""

import torch
from torch import nn

from runner.models.activations import activation as make_activation


class FFNN(nn.Module):
    def __init__(
        self,
        in_features: int,
        hidden: list[int],
        out_features: int,
        activation: str = "relu",
        output_activation: str = "none",
    ) -> None:
        super().__init__()
        widths = [in_features, *hidden, out_features]
        layers: list[nn.Module] = []
        for i, (n_in, n_out) in enumerate(zip(widths[:-1], widths[1:], strict=True)):
            layers.append(nn.Linear(n_in, n_out))
            last = i == len(widths) - 2
            layers.append(make_activation(output_activation if last else activation))
        self.layers = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)
