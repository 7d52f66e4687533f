"""scikit-learn's bundled tabular data sets, split once by a seeded permutation."""

from collections.abc import Callable

import numpy as np
import torch
from torch.utils.data import TensorDataset

from runner.data import Splits, digest


def _split(x: np.ndarray, y: torch.Tensor, val_fraction: float) -> Splits:
    # A fixed permutation: every seed and every rank sees the same split.
    order = np.random.default_rng(0).permutation(len(x))
    n_val = int(round(len(x) * val_fraction))
    val, train = order[:n_val], order[n_val:]
    xt = torch.as_tensor(x, dtype=torch.float32)
    content = digest(xt, y, torch.as_tensor(val))
    return Splits(TensorDataset(xt[train], y[train]), TensorDataset(xt[val], y[val]), 0, content)


def _load(loader: Callable, scale: Callable, targets: Callable, val_fraction: float) -> Splits:
    x, y = loader(return_X_y=True)
    return _split(scale(x), targets(y), val_fraction)


def load_digits(val_fraction: float = 0.2, **_: object) -> Splits:
    """8x8 digit images, pixels 0..16 scaled to 0..1; class labels 0..9."""
    from sklearn.datasets import load_digits as loader

    return _load(loader, lambda x: x / 16.0, torch.as_tensor, val_fraction)


def load_breast_cancer(val_fraction: float = 0.2, **_: object) -> Splits:
    """30 standardized features; the target (1 = benign) as a float column for a sigmoid output."""
    from sklearn.datasets import load_breast_cancer as loader

    def standardize(x: np.ndarray) -> np.ndarray:
        return (x - x.mean(axis=0)) / x.std(axis=0)

    def column(y: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(y, dtype=torch.float32).unsqueeze(1)

    return _load(loader, standardize, column, val_fraction)
