"""A search's answer: the layouts that fit, best first by the objective; the Pareto front of step
time against memory per device (no other layout is both faster and smaller); and, in words, why
the best beats the runner-up: what differs between them, and the part of the step that differs
most."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import fields

from runner.search.price import Priced
from runner.search.space import Layout

# search.objective -> its words and the figure it ranks by
BY: dict[str, tuple[str, Callable[[Priced], float]]] = {
    "time": ("step time", lambda p: p.step_time_s),
    "cost": ("cost", lambda p: p.cost_usd),
    "time_to_train": ("time to train", lambda p: p.hours),
}
TIE = 0.001  # closer than the planner can tell apart


def ranked(priced: list[Priced], objective: str) -> list[Priced]:
    """The layouts that fit, best first (ties: the one with less memory)."""
    _, figure = BY[objective]
    return sorted((p for p in priced if p.fits), key=lambda p: (figure(p), p.memory_gib))


def pareto(fitting: list[Priced]) -> list[Priced]:
    """The layouts no other is both faster than and smaller than, by memory."""
    front, least = [], math.inf
    for p in sorted(fitting, key=lambda p: (p.step_time_s, p.memory_gib)):
        if p.memory_gib < least:
            front.append(p)
            least = p.memory_gib
    return front


def differences(a: Layout, b: Layout) -> list[str]:
    """The layout's fields where a and b differ: 'microbatches 32 (16)'."""
    return [
        f"{f.name} {_word(getattr(a, f.name))} ({_word(getattr(b, f.name))})"
        for f in fields(Layout)
        if getattr(a, f.name) != getattr(b, f.name)
    ]


def _word(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def why(fitting: list[Priced], objective: str) -> str:
    """Why the best beats the runner-up (the first layout that does measurably worse; those that
    tie with the best, within 0.1 %, are counted), in a sentence or two."""
    words, figure = BY[objective]
    best, score = fitting[0], figure(fitting[0])
    ties = [p for p in fitting[1:] if figure(p) <= score * (1 + TIE)]
    rest = fitting[1 + len(ties) :]
    tie = "layouts tie" if len(ties) > 1 else "layout ties"
    said = (f"{len(ties):,} {tie} with the best (within {TIE:.1%}), "
            f"e.g. {ties[0].layout.words()}. " if ties else "")  # fmt: skip
    if not rest:
        return said + "Every layout that fits ties with it."
    second = rest[0]
    ahead = 1 - score / figure(second)
    parts = set(best.parts) | set(second.parts)
    gaps = {k: second.parts.get(k, 0.0) - best.parts.get(k, 0.0) for k in parts}
    part = max(gaps, key=lambda k: abs(gaps[k]))
    return said + (
        f"The best ({best.layout.words()}) is {ahead:.1%} ahead of the runner-up by {words} "
        f"({second.layout.words()}): it differs in "
        f"{', '.join(differences(best.layout, second.layout))} (the runner-up's in brackets); "
        f"its {part} is {abs(gaps[part]):.3g} s {'shorter' if gaps[part] > 0 else 'longer'} a step."
    )
