"""The straggler of a run: the rank whose own work in a step (its compute, and whatever holds it
up itself, such as sends its link is slow to take: the step less its waits for other ranks)
exceeds the median rank's by more than a quarter. The other ranks wait for it: the job's idle
time moves onto them. Named by node and rank, as Megatron-LM's straggler detector names a slow
GPU's; the run records it as its `straggler` tag and says it in its summary."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from runner.metrics import COMPUTE_TIME, of_rank

TAG = "straggler"
OVER_MEDIAN = 1.25  # a rank's work over the median rank's that makes it the straggler


@dataclass(frozen=True)
class Straggler:
    rank: int
    node: int
    work_s: float
    median_s: float

    def line(self) -> str:
        return (
            f"node {self.node}, rank {self.rank}: {self.work_s:.3g} s of its own work a step, "
            f"{self.work_s / self.median_s:.1f}x the median rank's {self.median_s:.3g} s"
        )


def straggler(figures: dict[str, float], world: int, per_node: int) -> Straggler | None:
    """The rank whose compute_time_s exceeds the median rank's by more than OVER_MEDIAN; None
    where no rank does (or a rank's time is missing: one rank, trainer.measure=false)."""
    work = [figures.get(of_rank(COMPUTE_TIME, r)) for r in range(world)]
    if world < 2 or None in work:
        return None
    median = statistics.median(work)
    slowest = max(range(world), key=lambda r: work[r])
    if work[slowest] <= OVER_MEDIAN * median:
        return None
    return Straggler(slowest, slowest // per_node, work[slowest], median)
