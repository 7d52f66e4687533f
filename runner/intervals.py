"""Time on a timeline as sets of intervals: how long something was in flight, how long two kinds
of work overlapped. Torch-free."""

from __future__ import annotations

Interval = tuple[float, float]


def merged(spans: list[Interval]) -> list[Interval]:
    """The union of the spans, as disjoint intervals in order."""
    out: list[Interval] = []
    for start, end in sorted(spans):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        elif end > start:
            out.append((start, end))
    return out


def union_s(spans: list[Interval]) -> float:
    """The time at least one of the spans was in flight."""
    return sum(end - start for start, end in merged(spans))


def overlap_s(a: list[Interval], b: list[Interval]) -> float:
    """The time something of `a` and something of `b` were both in flight."""
    total, later = 0.0, merged(b)
    for start, end in merged(a):
        total += sum(max(0.0, min(end, e) - max(start, s)) for s, e in later)
    return total


def clipped(spans: list[Interval], window: Interval) -> list[Interval]:
    lo, hi = window
    return [(max(s, lo), min(e, hi)) for s, e in spans if e > lo and s < hi]
