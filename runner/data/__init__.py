"""Data sets that ship with installed packages: nothing is downloaded at run time."""

from dataclasses import dataclass

from torch.utils.data import Dataset


@dataclass
class Splits:
    train: Dataset
    val: Dataset
    tokens_per_sample: int = 0  # sequence length for token data, 0 for vectors
