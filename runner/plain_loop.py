"""The plain PyTorch training step, with none of the runner's machinery: forward, loss, backward,
the optimizer. What a user writes by hand: mode=calibrate times it on this host (it sets the
profile's compute efficiency), and the benchmarks compare the runner's throughput with a loop of
it (benchmarks/plain_loop.py).
"""

from __future__ import annotations

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig
from torch import nn

from runner.autocast import autocast
from runner.losses import LOSSES, Loss
from runner.optimizers import OPTIMIZERS, options

CPU = torch.device("cpu")


def build(
    cfg: DictConfig, device: torch.device = CPU
) -> tuple[nn.Module, torch.optim.Optimizer, Loss]:
    """The config's model (seeded) on `device`, its optimizer and its loss, as the runner builds
    them."""
    torch.manual_seed(cfg.seed)
    model = instantiate(cfg.model, _convert_="all").to(device)
    t, params = cfg.trainer, list(model.parameters())
    optimizer = OPTIMIZERS[t.optimizer](
        params, lr=t.lr, weight_decay=t.weight_decay, **options(t.optimizer, params)
    )
    return model, optimizer, LOSSES[cfg.data.loss]


def step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn: Loss,
    x: torch.Tensor,
    y: torch.Tensor,
    precision: str = "32-true",
) -> torch.Tensor:
    """One training step; with DDP, backward holds the gradients' all-reduce. Mixed precision as
    Lightning's (forward and loss under autocast; no loss scaling: this loop times steps)."""
    optimizer.zero_grad()
    with autocast(precision, x.device):
        loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
    return loss


def random_batch(
    cfg: DictConfig, model: nn.Module, device: torch.device = CPU
) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of the configured shape; the values do not change the time a step takes."""
    b = cfg.data.batch_size
    if cfg.data.get("seq_len"):  # token ids in, next token ids out
        tokens = torch.randint(0, cfg.data.vocab_size, (b, cfg.data.seq_len), device=device)
        return tokens, tokens
    x = torch.randn(b, cfg.data.n_features, device=device)
    out = model(x)
    if cfg.data.loss == "cross_entropy":
        return x, torch.randint(0, out.shape[-1], (b,))
    return x, torch.rand_like(out).detach()
