"""Loss functions by the names the data configs give them."""

from collections.abc import Callable

import torch
import torch.nn.functional as F

Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Softmax + negative log-likelihood; (batch, classes) or (batch, time, vocab) logits."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


def half_mse(y_hat: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The seed's error function, 0.5 * (y - y_hat)^2 averaged: its derivative is y_hat - y."""
    return 0.5 * F.mse_loss(y_hat, y)


LOSSES: dict[str, Loss] = {
    "cross_entropy": cross_entropy,
    "mse": F.mse_loss,
    "half_mse": half_mse,
    "bce": F.binary_cross_entropy,  # on probabilities: the model ends in a sigmoid
}
