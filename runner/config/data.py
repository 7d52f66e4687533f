"""The data group: where samples come from, how they are batched, and the loss that fits them;
and its rules."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omegaconf import MISSING

from runner.choices import LOSSES
from runner.errors import one_of, positive, require


@dataclass
class DataConfig:
    _target_: str = MISSING  # a function returning runner.data.Splits
    batch_size: int = 32  # the global batch: every layout splits this one
    val_fraction: float = 0.1
    loss: str = MISSING  # one of runner.choices.LOSSES
    n_features: int = 0  # input width, for models that take vectors
    n_outputs: int = 0  # output width (classes, or 1 for a regression/binary target)


@dataclass
class TextDataConfig(DataConfig):
    _target_: str = "runner.data.text.load_text"
    loss: str = "cross_entropy"
    vocab_size: int = 2048
    seq_len: int = 64
    cache_dir: str = "${oc.env:XDG_CACHE_HOME,${oc.env:HOME}/.cache}/parallel-runner"


MIN_BPE_VOCAB = 256 + 2  # byte-level BPE keeps every byte, plus <pad> and <unk>


def check_data(data: Any, output: str | None) -> None:
    """`output`: the activation the model ends in (its spec says), which a loss may need."""
    positive(data, "data", "batch_size")
    vocab = data.get("vocab_size")
    if vocab is not None:
        require(vocab >= MIN_BPE_VOCAB, "data.vocab_size", f"must be {MIN_BPE_VOCAB} or more")
    require(0 <= data.val_fraction < 1, "data.val_fraction", "must be in [0, 1)")
    one_of(data.loss, "data.loss", LOSSES)
    if data.loss == "bce":
        require(
            output == "sigmoid",
            "data.loss",
            f"bce needs a sigmoid output, the model ends in '{output}'",
        )
