"""`make bench`: every benchmark, one after another, and a table of their last lines.

Each benchmark runs as its own process and prints its own table; this collects the lines that
carry a target into one Markdown table with the date, the machine and the command. With --docs
the table also replaces the one in docs/benchmarks.md (between the `bench` markers).
Usage: .venv/bin/python -m benchmarks [--docs]
"""

from __future__ import annotations

import datetime
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import machine

BENCHMARKS = [
    "overhead",
    "system_metrics",
    "startup",
    "pipeline_bubble",
    "pipeline_cost",
    "crossover",
    "recompute_time",
    "network",
    "search",
    "memory_peak",
    "precision_curves",
]
RESULT = re.compile(r"^(?P<name>.+): (?P<value>[-+0-9.]+) \(target (?P<target>.+)\)$")
PAGE = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
MARKERS = ("<!-- bench -->", "<!-- /bench -->")
FAILED = "ran to its end"  # the target of a benchmark that failed: the row that says so


def load() -> str:
    """The machine's load averages: with 2 cores, anything else running (a test suite) slows every
    benchmark down, and the walls and the medians with it."""
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def run(name: str) -> list[dict[str, str]]:
    """Run one benchmark; its results, or one row saying it failed and why (its error's first
    line): the others' results are kept. Its output, its wall time and the machine's load are
    printed too: what a slow `make bench` spent its time on."""
    print(f"== benchmarks.{name} ({load()})", flush=True)
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{name}"], capture_output=True, text=True
    )
    print(done.stdout, flush=True)
    print(done.stderr, file=sys.stderr, flush=True)
    print(f"== benchmarks.{name}: {time.perf_counter() - start:.0f} s ({load()})", flush=True)
    if done.returncode:
        said = [line.strip() for line in done.stderr.splitlines() if line.strip()]
        why = said[0] if said else f"exit code {done.returncode}"
        return [{"benchmark": name, "name": f"failed: {why[:160]}", "value": "", "target": FAILED}]
    found = (RESULT.match(line) for line in done.stdout.splitlines())
    return [m.groupdict() | {"benchmark": name} for m in found if m]


def met(value: str, target: str) -> str:
    if target == FAILED:
        return "**no**"
    if "not judged" in target:  # the benchmark's probe found the host moved more than the margin
        return "not judged"
    between = re.fullmatch(r"([0-9.]+) to ([0-9.]+)", target)
    if between:
        return "yes" if float(between[1]) <= float(value) <= float(between[2]) else "**no**"
    bound = re.fullmatch(r"([<>]=?) ([0-9.]+)", target)
    if not bound:
        return ""
    v, b = float(value), float(bound[2])
    ok = {"<": v < b, "<=": v <= b, ">": v > b, ">=": v >= b}[bound[1]]
    return "yes" if ok else "**no**"


def cell(text: str) -> str:
    """A Markdown table's cell: a figure named |x - 1| would otherwise end its cell at the bar."""
    return text.replace("|", "\\|")


def table(results: list[dict[str, str]], minutes: float) -> str:
    today = datetime.date.today().isoformat()
    lines = [
        f"{today}, {machine()}, `make bench` ({minutes:.1f} min):",
        "",
        "| benchmark | figure | value | target | met |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['benchmark']} | {cell(r['name'])} | {r['value']} | {cell(r['target'])} | "
        f"{met(r['value'], r['target'])} |"
        for r in results
    ]
    return "\n".join(lines)


def update_page(text: str) -> None:
    page = PAGE.read_text()
    head, rest = page.split(MARKERS[0], 1)
    _, tail = rest.split(MARKERS[1], 1)
    PAGE.write_text(f"{head}{MARKERS[0]}\n{text}\n{MARKERS[1]}{tail}")


def main() -> None:
    start = time.perf_counter()
    results = [r for name in BENCHMARKS for r in run(name)]
    text = table(results, (time.perf_counter() - start) / 60)
    print(text)
    if "--docs" in sys.argv[1:]:
        update_page(text)
    failed = [r["benchmark"] for r in results if r["target"] == FAILED]
    if failed:
        sys.exit(f"failed: {', '.join(failed)} (the others' results are in the table)")


if __name__ == "__main__":
    main()
