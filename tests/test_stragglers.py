"""The straggler (runner/stragglers.py): the rank whose own work a step exceeds the median rank's
by more than a quarter, named with its node; none where every rank is within it."""

from __future__ import annotations

import pytest

from runner.stragglers import straggler


def work(*seconds: float) -> dict[str, float]:
    return {f"rank_{r}/compute_time_s": s for r, s in enumerate(seconds)}


def test_the_straggler_is_the_rank_far_above_the_median_with_its_node() -> None:
    found = straggler(work(0.10, 0.11, 0.40, 0.10), world=4, per_node=2)
    assert (found.rank, found.node) == (2, 1) and found.median_s == pytest.approx(0.105)
    assert found.line().startswith("node 1, rank 2: 0.4 s of its own work a step, 3.8x the median")


def test_no_straggler_within_a_quarter_of_the_median_or_without_every_rank() -> None:
    assert straggler(work(0.10, 0.12, 0.13, 0.10), world=4, per_node=2) is None  # 1.18x
    assert straggler(work(0.10), world=1, per_node=1) is None
    assert straggler(work(0.10, 0.50), world=3, per_node=1) is None  # rank 2's time missing
