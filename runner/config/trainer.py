"""The trainer group: steps, optimizer, learning rate, validation, warm-up; and its rules."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runner.choices import OPTIMIZERS
from runner.errors import one_of, positive, require


@dataclass
class TrainerConfig:
    max_steps: int = 200
    optimizer: str = "adamw"  # one of runner.choices.OPTIMIZERS
    lr: float = 1e-3
    weight_decay: float = 0.0
    val_every_n_steps: int = 50
    val_batches: int = 8  # batches per validation, 0 for none
    warmup_steps: int = 5  # steps left out of step time and throughput
    progress_bar: bool = True
    # false: losses and throughput only, no per-rank timing, traffic counting or timeline (the
    # baseline of what measuring costs: benchmarks/overhead.py)
    measure: bool = True


def check_trainer(t: Any) -> None:
    positive(t, "trainer", "max_steps", "lr", "val_every_n_steps")
    require(t.weight_decay >= 0, "trainer.weight_decay", f"must be 0 or more, got {t.weight_decay}")
    one_of(t.optimizer, "trainer.optimizer", OPTIMIZERS)
    require(t.val_batches >= 0, "trainer.val_batches", f"must be 0 or more, got {t.val_batches}")
    require(
        0 <= t.warmup_steps < t.max_steps,
        "trainer.warmup_steps",
        f"must be in 0..trainer.max_steps-1 (timing needs steps after it), got {t.warmup_steps}",
    )
