"""The activation functions the seed uses, by the names the configs give them."""

from torch import nn

ACTIVATIONS: dict[str, type[nn.Module]] = {
    "relu": nn.ReLU,
    "sigmoid": nn.Sigmoid,
    "tanh": nn.Tanh,
    "none": nn.Identity,
}


def activation(name: str) -> nn.Module:
    return ACTIVATIONS[name]()
