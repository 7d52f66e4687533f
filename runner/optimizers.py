"""Optimizers by the names the trainer config gives them (runner.choices.OPTIMIZERS)."""

import torch

OPTIMIZERS: dict[str, type[torch.optim.Optimizer]] = {
    "adamw": torch.optim.AdamW,
    "sgd": torch.optim.SGD,
}
