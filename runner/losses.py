"""Loss functions by the names the data configs give them."""

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import loss_parallel

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


def on_shards(sharded: bool) -> AbstractContextManager:
    """Where a loss, and its backward, run when the model's output is split over the vocabulary
    (a DTensor sharded on its last dim): torch's loss_parallel, whose cross-entropy sums the
    shards' softmax by all-reduce rather than gathering the logits. Its backward must run inside
    it too. Not reentrant: one caller enters it."""
    return loss_parallel() if sharded else nullcontext()


def sharded(output: object) -> bool:
    return isinstance(output, DTensor)


def replicated(loss: Loss) -> Loss:
    """`loss` as a plain tensor: loss_parallel's is a replicated DTensor, the same on every rank;
    its local value takes the gradient back into the DTensor graph."""

    def plain(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        value = loss(output, target)
        return value.to_local() if isinstance(value, DTensor) else value

    return plain
