"""A study's answer, on its sweep's parent run: report.md (the question, a row per job with each
figure measured beside its prediction and the difference, in units people read, and a paragraph of
answer computed from those numbers) and a chart per figure (charts/<figure>.png: the swept key on
the x-axis, a line per value of the other swept keys, the prediction dashed, the jobs that failed
or do not fit marked). The study's block (runner/config/study.py) says what to compare.
"""

from __future__ import annotations

import itertools
import math
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mlflow import MlflowClient
from mlflow.entities import Run

from runner.metrics import (
    BYTES,
    COUNT,
    FRACTION,
    GIB,
    PLAN_FITS,
    SECONDS,
    registered,
)
from runner.studies.lines import FORMULAS
from runner.tracking.pictures import Figure
from runner.tracking.store import children, option_tag
from runner.units import BYTE_UNITS

MISSING = "-"


@dataclass(frozen=True)
class Job:
    number: int  # the job's #N: its row, and its point's label on a chart
    run: Run
    x: str  # the swept key's value, as logged
    values: tuple[str, ...]  # the other swept keys' values: which line of a chart
    keys: tuple[str, ...]  # those keys
    repeated: tuple[str, ...] = ()  # the values of the keys its point is the mean over
    ends: str = "FINISHED"  # how its study's jobs end (study.ends): FAILED

    @property
    def line(self) -> str:
        """ "pp=8 microbatches=32": each key by its last part, as short as still says what."""
        pairs = zip(self.keys, self.values, strict=True)
        return " ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in pairs)

    @property
    def status(self) -> str:
        return self.run.info.status

    @property
    def fits(self) -> bool | None:
        """A plan's verdict (its `fits`); None for a job that was not planned."""
        fits = self.run.data.metrics.get(PLAN_FITS.name)
        return None if fits is None else fits > 0

    @property
    def counts(self) -> bool:
        """Whether its figures answer the question: it ended as the study's jobs end (finished,
        or failed where a fault is the study's point), and fits where it was planned."""
        return self.status == self.ends and self.fits is not False

    def measured(self, figure: str) -> float | None:
        return self.run.data.metrics.get(figure)

    @property
    def flaw(self) -> str | None:
        if self.status != self.ends:
            return self.status.lower()
        return "does not fit" if self.fits is False else None


def jobs_of(runs: list[Run], study: Mapping[str, Any]) -> list[Job]:
    def value(run: Run, key: str | None) -> str:
        """A key's value as the job logged it; a config group's option (parallel) as tagged."""
        if key is None:
            return MISSING
        tags = run.data.tags
        found = run.data.params.get(key) or tags.get(option_tag(key)) or tags.get(key)
        return found or MISSING

    return [
        Job(
            i,
            run,
            value(run, study["x"]),
            tuple(value(run, k) for k in study["lines"]),
            tuple(study["lines"]),
            tuple(value(run, k) for k in study.get("repeats") or []),
            study.get("ends") or "FINISHED",
        )
        for i, run in enumerate(runs, 1)
    ]


def numeric(values: Sequence[str]) -> bool:
    try:
        [float(v) for v in values]
    except ValueError:
        return False
    return True


def ordered(jobs: list[Job]) -> list[Job]:
    """Along the x-axis: by value where every x is a number, else in the order the jobs ran."""
    if numeric([j.x for j in jobs]):
        return sorted(jobs, key=lambda j: float(j.x))
    return list(jobs)


def lines_of(jobs: list[Job]) -> dict[str, list[Job]]:
    found: dict[str, list[Job]] = {}
    for job in jobs:
        found.setdefault(job.line, []).append(job)
    return {line: ordered(members) for line, members in found.items()}


def predictions(jobs: list[Job], figure: str, study: Mapping[str, Any]) -> dict[int, float | None]:
    """Each job's predicted value of the figure: a metric of its own run, or the formula along its
    line; none where the study gives no line to hold it against."""
    line = study["predicted"].get(figure)
    if line is None:
        return {}
    if line not in FORMULAS:
        return {j.number: j.run.data.metrics.get(line) for j in jobs}
    out: dict[int, float | None] = {}
    for members in lines_of(jobs).values():
        xs = [float(j.x) if numeric([j.x]) else float(i) for i, j in enumerate(members)]
        values = FORMULAS[line](xs, [j.measured(figure) if j.counts else None for j in members])
        out |= {j.number: v for j, v in zip(members, values, strict=True)}
    return out


# --- units people read ---


@dataclass(frozen=True)
class Shown:
    factor: float
    unit: str

    def __call__(self, value: float | None, unit: bool = True) -> str:
        """The value in this unit; without it where a table's heading says it."""
        return self.text(value, unit, signed=False, points=False)

    def gap(self, value: float | None, signed: bool = True, unit: bool = True) -> str:
        """A difference: signed, and in points where the figure is a percentage."""
        return self.text(value, unit, signed, points=True)

    def text(self, value: float | None, unit: bool, signed: bool, points: bool) -> str:
        if value is None or math.isnan(value):
            return MISSING
        scaled = value * self.factor
        text = f"{scaled:,.0f}" if abs(scaled) >= 1000 else f"{scaled:.3g}"
        text = f"+{text}" if signed and scaled >= 0 else text
        if not unit:
            return text
        if self.unit == "%":
            return f"{text} pts" if points else f"{text}%"
        return f"{text} {self.unit}".rstrip()


def shown_in(figure: str, values: Sequence[float | None]) -> Shown:
    """The unit a figure reads best in: %, ms or s, kB to GB, GiB; its registered one otherwise."""
    entry = registered(figure)
    unit = entry.unit if entry else ""
    largest = max((abs(v) for v in values if v is not None), default=0.0)
    if unit == FRACTION:
        return Shown(100.0, "%")
    if unit == SECONDS:
        return Shown(1000.0, "ms") if largest < 1 else Shown(1.0, "s")
    if unit == BYTES:
        for name, scale in BYTE_UNITS:
            if largest >= scale:
                return Shown(1 / scale, name)
        return Shown(1.0, "B")
    if unit == GIB:
        return Shown(1.0, "GiB")
    if unit == COUNT:
        return Shown(1.0, "")  # the figure's name says what it counts: lost_steps
    return Shown(1.0, unit)


# --- report.md ---


def keys_named(study: Mapping[str, Any]) -> str:
    swept = ", ".join([study["x"] or "", *study["lines"]]).strip(", ")
    return swept or "the jobs"


def table(jobs: list[Job], study: Mapping[str, Any]) -> str:
    planned = any(j.fits is not None for j in jobs)  # a plan's verdict: a column of its own
    header = [
        "job",
        study["x"] or "run",
        *study["lines"],
        *(study.get("repeats") or []),
        "status",
        *([PLAN_FITS.name] if planned else []),
    ]
    cells: list[list[str]] = [
        [
            f"#{j.number}",
            j.x if study["x"] else str(j.run.info.run_name),
            *j.values,
            *j.repeated,
            j.status,
        ]  # fmt: skip
        + ([{None: MISSING, True: "yes", False: "**no**"}[j.fits]] if planned else [])
        for j in jobs
    ]
    for figure in study["figures"]:
        predicted = predictions(jobs, figure, study)
        measured = [j.measured(figure) for j in jobs]
        shown = shown_in(figure, measured + list(predicted.values()))
        header.append(f"{figure} ({shown.unit})" if shown.unit else figure)
        for row, job in zip(cells, jobs, strict=True):
            row.append(shown(job.measured(figure), unit=False))
        if predicted:
            gaps = "difference (pts)" if shown.unit == "%" else "difference"
            header += [f"predicted: {study['predicted'][figure]}", gaps]
            for row, job in zip(cells, jobs, strict=True):
                guess, got = predicted.get(job.number), job.measured(figure)
                gap = None if guess is None or got is None else got - guess
                row += [shown(guess, unit=False), shown.gap(gap, unit=False)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in cells]
    return "\n".join(lines)


# --- the answer, in words ---


def points_of(figure: str, members: list[Job]) -> list[tuple[str, float]]:
    """A line's measured points that answer the question, in the order of x. Jobs at the same x
    of a line differ only in keys a point is the mean over (study.repeats): where a fault
    strikes, a seed."""
    return mean_at_x([(j.x, j.measured(figure)) for j in members if j.counts])


def mean_at_x(values: Sequence[tuple[str, float | None]]) -> list[tuple[str, float]]:
    found: dict[str, list[float]] = {}
    for at, value in values:
        if value is not None:
            found.setdefault(at, []).append(value)
    return [(at, math.fsum(got) / len(got)) for at, got in found.items()]


def span(points: list[tuple[str, float]], x: str) -> str:
    """Where along x a line's points lie: "as parallel.microbatches goes 2 → 8"."""
    if len(points) == 1:
        return f"at {x}={points[0][0]}"
    if numeric([at for at, _ in points]):
        return f"as {x} goes {points[0][0]} → {points[-1][0]}"
    return f"over {x}"


def trend(points: list[tuple[str, float]], x: str, shown: Shown) -> str:
    """How a line moves: "falls from 43% to 11%", or where it is lowest and highest."""
    if len(points) == 1:
        return f"is {shown(points[0][1])}"
    if numeric([at for at, _ in points]):
        first, last = shown(points[0][1]), shown(points[-1][1])
        ends = [0, *turns(points, shown), len(points) - 1]
        if len(ends) == 2 and first == last:
            return f"stays at {first}"
        moves = []  # "rises from 486 to 629 at parallel.microbatches=4", "then falls to 558"
        for start, end in itertools.pairwise(ends):
            verb = "rises" if points[end][1] > points[start][1] else "falls"
            since = f" from {shown(points[start][1])}" if start == 0 else ""
            at = f" at {x}={points[end][0]}" if end != len(points) - 1 else ""
            moves.append(f"{verb}{since} to {shown(points[end][1])}{at}")
        return ", then ".join(moves)
    low = min(points, key=lambda p: p[1])
    high = max(points, key=lambda p: p[1])
    if shown(low[1]) == shown(high[1]):
        return f"is {shown(low[1])} at every {x}"
    lowest, highest = f"{x}={low[0]} ({shown(low[1])})", f"{x}={high[0]} ({shown(high[1])})"
    return f"is lowest at {lowest} and highest at {highest}"


def turns(points: list[tuple[str, float]], shown: Shown) -> list[int]:
    """Where a line along x turns: the points past which it falls after rising or rises after
    falling (steps that look flat as shown do neither). A lesson that holds up to a point (more
    micro-batches help, until each one's own cost outweighs the bubble it removes) says where."""
    found, heading, since = [], 0, 0
    for i, ((_, a), (_, b)) in enumerate(itertools.pairwise(points)):
        step = 0 if shown(a) == shown(b) else (1 if b > a else -1)
        if step and heading and step != heading:
            found.append(since)
        if step:
            heading, since = step, i + 1
    return found


def agreement(figure: str, jobs: list[Job], study: Mapping[str, Any], shown: Shown) -> str | None:
    """How far the measurement is from its line: "bubble_fraction_theory within 3 pts at every
    point"."""
    predicted = predictions(jobs, figure, study)
    pairs = []  # a point's measured value and its prediction: a line's repeats at an x, averaged
    for members in lines_of(jobs).values():
        counted = [j for j in members if j.counts]
        got = dict(points_of(figure, counted))
        guess = dict(mean_at_x([(j.x, predicted.get(j.number)) for j in counted]))
        pairs += [(got.get(at), guess.get(at)) for at in dict.fromkeys(j.x for j in counted)]
    known = [(got, guess) for got, guess in pairs if got is not None and guess is not None]
    if not known:
        return None
    gaps = [abs(got - guess) for got, guess in known]
    where = "at every point" if len(gaps) == len(pairs) else f"at the {len(gaps)} points it has"
    close = "exactly" if max(gaps) == 0 else f"within {shown.gap(max(gaps), signed=False)}"
    return f"{study['predicted'][figure]} {close} {where}{ranked(known, shown)}"


def ranked(pairs: list[tuple[float, float]], shown: Shown) -> str:
    """Whether a prediction orders the points as they measured, and how far off it is at worst,
    where there are 3 points or more to order: ", at most 14% off, its ranking of the points against
    the measured one: Spearman 0.98" (1: the same order). A percentage is off in points already."""
    got, guess = zip(*pairs, strict=True)
    if len(pairs) < 3 or len(set(got)) < 2 or len(set(guess)) < 2:
        return ""
    off = (
        ""
        if shown.unit == "%" or 0 in got
        else (f", at most {100 * max(abs(p / m - 1) for m, p in pairs):.0f}% off")
    )
    from scipy.stats import spearmanr  # as mode=report ranks them; only once a sweep has ended

    rho = spearmanr(got, guess).statistic
    return f"{off}, its ranking of the points against the measured one: Spearman {rho:.2f}"


def sentence(figure: str, jobs: list[Job], study: Mapping[str, Any]) -> str | None:
    """ "bubble_fraction_measured, as parallel.microbatches goes 2 → 8: gpipe falls from 67% to
    56%, 1f1b ...; bubble_fraction_theory within 53 pts at every point." """
    x = study["x"] or "job"
    shown = shown_in(figure, [j.measured(figure) for j in jobs])
    lines = {line: points_of(figure, members) for line, members in lines_of(jobs).items()}
    lines = {line: points for line, points in lines.items() if points}
    if not lines:
        return None
    spans = {span(points, x) for points in lines.values()}
    shared = spans.pop() if len(spans) == 1 else None
    moves = [
        " ".join(filter(None, (line, trend(points, x, shown), None if shared else span(points, x))))
        for line, points in lines.items()
    ]
    agreed = agreement(figure, jobs, study, shown)
    head = f"{figure}, {shared}: " if shared else f"{figure}: "
    return head + ", ".join(moves) + (f"; {agreed}" if agreed else "") + "."


def named(job: Job, x: str) -> str:
    return f"#{job.number} ({x}={job.x}{' ' + job.line if job.line else ''})"


def best(jobs: list[Job], study: Mapping[str, Any]) -> str | None:
    """ "The lowest cost_usd of the jobs that finished and fit: #7 (parallel.tp=8 16 32), 4.1e6
    USD." """
    if not study.get("best"):
        return None
    how, _, figure = study["best"].partition(" ")
    ranked = [j for j in jobs if j.counts and j.measured(figure) is not None]
    if not ranked:
        return None
    pick = (min if how == "lowest" else max)(ranked, key=lambda j: j.measured(figure) or 0.0)
    shown = shown_in(figure, [j.measured(figure) for j in ranked])
    which = "finished and fit" if any(j.fits is not None for j in jobs) else "finished"
    value = shown(pick.measured(figure))
    return (
        f"The {how} {figure} of the jobs that {which}: {named(pick, study['x'] or 'job')}, {value}."
    )


def tie(points: Sequence[tuple[float, float, float]]) -> float | None:
    """Where two lines tie: (x, a, b) in the order of x, the first x at which b - a changes sign,
    between the two points around it, on log scales (x and the ratio b / a). None: no change."""
    for (x0, a0, b0), (x1, a1, b1) in itertools.pairwise(points):
        r0, r1 = math.log(b0 / a0), math.log(b1 / a1)
        if r0 == 0 or r1 == 0:
            return x0 if r0 == 0 else x1
        if r0 * r1 < 0:
            share = r0 / (r0 - r1)
            return math.exp(math.log(x0) + share * (math.log(x1) - math.log(x0)))
    return None


def crossover(jobs: list[Job], study: Mapping[str, Any]) -> str | None:
    """ "step_time_s: devices=2 ties with devices=1 at data.batch_size 2.6 measured, 3.1 as
    pred/step_time_s has it." Two lines of one swept key, on a numeric x."""
    figure = study.get("crossover")
    lines = lines_of([j for j in jobs if j.counts])
    if not figure or len(lines) != 2 or not numeric([j.x for j in jobs]):
        return None
    (first, a), (second, b) = lines.items()
    guessed = predictions(jobs, figure, study)

    def ties(read: Any) -> float | None:
        at_a = {float(j.x): read(j) for j in a}
        pairs = [(float(j.x), at_a.get(float(j.x)), read(j)) for j in b]
        known = sorted((x, u, v) for x, u, v in pairs if u and v)
        return tie(known) if len(known) > 1 else None

    measured = ties(lambda j: j.measured(figure))
    predicted = ties(lambda j: guessed.get(j.number))
    x, where = study["x"], lambda at: "no tie in the range" if at is None else f"{at:.3g}"
    head = f"{figure}: {second} ties with {first} at {x} {where(measured)} measured"
    line = study["predicted"].get(figure)
    return head + (f", {where(predicted)} as {line} has it." if line else ".")


def answer(jobs: list[Job], study: Mapping[str, Any]) -> str:
    """One paragraph, every number in it read from the runs."""
    said = [s for s in (sentence(f, jobs, study) for f in study["figures"]) if s]
    said += [c for c in [crossover(jobs, study)] if c]
    said += [b for b in [best(jobs, study)] if b]
    x = study["x"] or "job"
    flawed = [j for j in jobs if j.flaw]
    for flaw in sorted({j.flaw for j in flawed if j.flaw}):
        which = [j for j in flawed if j.flaw == flaw]
        said.append(
            f"{len(which)} of {len(jobs)} jobs {flaw_verb(flaw)}: "
            + ", ".join(named(j, x) for j in which)
            + "."
        )
    said += [p for p in [priced_by(jobs, study)] if p]
    return " ".join(said) or "No job of the study finished with its figures."


def priced_by(jobs: list[Job], study: Mapping[str, Any]) -> str | None:
    """What priced a study's predictions (each job's `priced_by` tag): its profile's figures, or
    this host's calibration (hardware.figures=host)."""
    if not any(line.startswith("pred/") for line in study["predicted"].values()):
        return None
    priced = sorted({j.run.data.tags.get("priced_by") for j in jobs} - {None})
    return f"Predictions priced by {'; '.join(priced)}." if priced else None


def flaw_verb(flaw: str) -> str:
    return "do not fit" if flaw == "does not fit" else f"ended {flaw.upper()}"


def report(jobs: list[Job], study: Mapping[str, Any], said: str) -> str:
    parts = [f"# {study['question']}"]
    parts += [f"Expected: {study['expects']}"] if study["expects"] else []
    parts += [f"Swept: {keys_named(study)}; {len(jobs)} jobs.", "## Answer", said]
    parts += ["## Jobs", table(jobs, study)]
    if study["figures"]:
        charts = ", ".join(f"charts/{chart_name(f)}" for f in study["figures"])
        parts.append(f"Charts: {charts}.")
    return "\n\n".join(parts) + "\n"


# --- the charts ---

FLAW_COLOR = "#C44E52"


def chart_name(figure: str) -> str:
    return figure.replace("/", "_") + ".png"


def chart(jobs: list[Job], figure: str, study: Mapping[str, Any]) -> Figure:
    """The figure along x: a line per value of the other swept keys, the prediction dashed, the
    jobs that failed or do not fit as red crosses named on the chart."""
    predicted = predictions(jobs, figure, study)
    shown = shown_in(figure, [j.measured(figure) for j in jobs] + list(predicted.values()))
    on_numbers = numeric([j.x for j in jobs])
    positions = {x: i for i, x in enumerate(dict.fromkeys(j.x for j in ordered(jobs)))}
    place = (lambda x: float(x)) if on_numbers else (lambda x: float(positions[x]))
    at = lambda j: place(j.x)  # noqa: E731
    fig = Figure(figsize=(7, 4.5), layout="tight")
    ax = fig.add_subplot()
    for i, (line, members) in enumerate(lines_of(jobs).items()):
        color = f"C{i}"
        ok = [j for j in members if j.counts and j.measured(figure) is not None]
        label = line.strip(MISSING + " ") or "measured"
        points = points_of(figure, members)
        mean = len(points) < len(ok)  # repeats at an x: each job a dot around their mean
        xs, ys = [place(x) for x, _ in points], [v * shown.factor for _, v in points]
        ax.plot(xs, ys, marker="o", color=color, label=f"{label}: mean" if mean else label)
        if mean:
            ys = [j.measured(figure) * shown.factor for j in ok]  # type: ignore[operator]
            ax.plot([at(j) for j in ok], ys, marker=".", color=color, alpha=0.4, linestyle="none")
        guessed = mean_at_x([(j.x, predicted.get(j.number)) for j in members])
        predicted_by = study["predicted"].get(figure)
        if guessed:
            ax.plot(
                [place(x) for x, _ in guessed],
                [v * shown.factor for _, v in guessed],
                linestyle="--",
                color=color,
                label=f"{label}: {predicted_by}" if line else predicted_by,
            )
    bottom = ax.get_ylim()[0]
    for job in [j for j in jobs if j.flaw]:
        value = job.measured(figure)
        y = bottom if value is None else value * shown.factor
        ax.plot([at(job)], [y], marker="x", markersize=10, color=FLAW_COLOR, linestyle="none")
        ax.annotate(f"#{job.number} {job.flaw}", (at(job), y), fontsize=7, color=FLAW_COLOR,
                    xytext=(4, 4), textcoords="offset points")  # fmt: skip
    if on_numbers:  # the swept values, not matplotlib's round numbers between them
        xs = sorted({float(j.x) for j in jobs})
        if xs[0] > 0 and xs[-1] / xs[0] >= 8:
            ax.set_xscale("log", base=2)  # 1, 2, 4, 8: evenly spaced, as they were chosen
        ax.set_xticks(xs, sorted({j.x for j in jobs}, key=float))
        ax.minorticks_off()
    else:
        ax.set_xticks(list(positions.values()), list(positions), fontsize=8, rotation=20)
    if ax.get_ylim()[0] > 0:
        ax.set_ylim(bottom=0)  # a fall from 60 to 55 looks as small as it is
    ax.set_xlabel(study["x"] or "job")
    ax.set_ylabel(f"{figure} ({shown.unit})" if shown.unit else figure)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(textwrap.fill(study["question"], 80), fontsize=9)
    return fig


def log_study(client: MlflowClient, parent_id: str, study: Mapping[str, Any]) -> str | None:
    """Write the study's answer on its parent run; the paragraph (None for a sweep of no job)."""
    runs = children(client, client.get_run(parent_id))
    if not runs:
        return None
    jobs = jobs_of(runs, study)
    said = answer(jobs, study)
    client.log_text(parent_id, report(jobs, study, said), "report.md")
    for figure in study["figures"]:
        client.log_figure(parent_id, chart(jobs, figure, study), f"charts/{chart_name(figure)}")
    return said
