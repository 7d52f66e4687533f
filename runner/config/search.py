"""mode=search's settings, and their rules: the grid of layouts it prices and how it ranks them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from runner.choices import RECOMPUTE, SCHEDULES, SHARDS
from runner.errors import one_of, require

OBJECTIVES = ("time", "cost", "time_to_train")


@dataclass
class SearchConfig:
    """mode=search: every layout of the model for the job's global batch (data.batch_size) and
    precision (trainer.precision) on hardware.nodes x hardware.devices, priced by the planner. A
    list names the values tried; null: every value the job allows (a divisor of the devices)."""

    top: int = 10  # layouts printed, the best that fit first
    # time: step time; cost: the training's price (plan.tokens, plan.hours or trainer.max_steps);
    # time_to_train: its hours. With one node count the three rank alike; with several
    # (search.nodes) more nodes train sooner but may cost more.
    objective: str = "time"
    nodes: list[int] | None = None  # node counts tried; null: hardware.nodes
    tp: list[int] | None = None  # null: every divisor of a node's devices (tp on its own links)
    pp: list[int] | None = None
    cp: list[int] | None = None  # context parallelism, for a model with a sequence
    ep: list[int] | None = None  # expert parallelism, for a model with experts
    micro_batch_size: list[int] = field(default_factory=lambda: [1, 2, 4, 8])  # samples
    schedule: list[str] = field(default_factory=lambda: list(SCHEDULES))
    virtual_stages: list[int] = field(default_factory=lambda: [1, 2, 4])  # interleaved's
    shard: list[str] = field(default_factory=lambda: list(SHARDS))
    recompute: list[str] = field(default_factory=lambda: list(RECOMPUTE))
    sequence_parallel: list[bool] = field(default_factory=lambda: [False, True])


def check_search(s: Any) -> None:
    require(s.top > 0, "search.top", f"must be positive, got {s.top}")
    one_of(s.objective, "search.objective", OBJECTIVES)
    for key in ("nodes", "tp", "pp", "cp", "ep", "micro_batch_size", "virtual_stages"):
        values = s[key]
        require(values is None or len(values) > 0, f"search.{key}", "an empty list tries nothing")
        bad = [v for v in values or [] if v <= 0]
        require(not bad, f"search.{key}", f"sizes must be positive, got {bad[0] if bad else ''}")
    for key, allowed in (("schedule", SCHEDULES), ("shard", SHARDS), ("recompute", RECOMPUTE)):
        require(len(s[key]) > 0, f"search.{key}", f"an empty list tries nothing: {allowed}")
        for value in s[key]:
            one_of(value, f"search.{key}", allowed)
    require(
        len(s.sequence_parallel) > 0, "search.sequence_parallel", "an empty list: [false, true]"
    )
