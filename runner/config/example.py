"""mode=example's worked example: the seed's inputs and initial weights; and its rule."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

from runner.choices import EXAMPLES
from runner.errors import one_of, require


@dataclass
class ExampleConfig:
    """A worked example of the seed, computed by the real model with autograd."""

    name: str = MISSING  # one of runner.choices.EXAMPLES
    inputs: list[float] = MISSING
    target: float | None = None
    lr: float | None = None
    shifted_bias: float | None = None
    # One {weight, bias} per Linear layer, in order: the seed's initial weights.
    weights: list[Any] = field(default_factory=list)


def check_example(example: Any) -> None:
    needs = "mode=example needs an example (see experiments/)"
    require(example is not None, "example", needs)
    one_of(example.name, "example.name", EXAMPLES)
