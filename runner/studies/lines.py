"""The formulas a study may hold a figure against when no run logs its prediction: each takes the
swept values and the measured ones along one line of a chart (in the order of x) and gives the
expected value at each point. Pure Python: the config's checks read the names.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

Line = Callable[[Sequence[float], Sequence[float | None]], list[float | None]]


def ideal_scaling(xs: Sequence[float], measured: Sequence[float | None]) -> list[float | None]:
    """The first point's value grown in proportion to x: n replicas, n times the samples/s."""
    if not measured or measured[0] is None or not xs[0]:
        return [None] * len(xs)
    return [measured[0] * x / xs[0] for x in xs]


def same(xs: Sequence[float], measured: Sequence[float | None]) -> list[float | None]:
    """The first point's value everywhere: layouts that must not change the loss."""
    return [measured[0] if measured else None] * len(xs)


def half_interval(xs: Sequence[float], measured: Sequence[float | None]) -> list[float | None]:
    """Half the snapshot interval x: the work a failure throws away on average, as the planner
    prices it (runner/planner/failures.py), for a failure that strikes at any moment."""
    return [x / 2 for x in xs]


FORMULAS: dict[str, Line] = {
    "ideal_scaling": ideal_scaling,
    "same": same,
    "half_interval": half_interval,
}
