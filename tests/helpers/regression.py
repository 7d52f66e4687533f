"""The planner's regression table (tests/regression/planner.yaml): figures `mode=plan` gives for
published-scale jobs that docs/planner.md quotes, which no formula in a test derives. They are not
truth, only what the planner said when the table was last written: a planner change that moves
one fails tests/test_planner_regression.py, and rewriting the table is a deliberate act whose diff
is reviewed:

    .venv/bin/python -m tests.helpers.regression --update
"""

from __future__ import annotations

import argparse
from functools import reduce
from pathlib import Path
from typing import Any

import yaml

TABLE = Path(__file__).resolve().parents[1] / "regression" / "planner.yaml"


def load() -> dict[str, Any]:
    return yaml.safe_load(TABLE.read_text())


def figure(plan: dict[str, Any], path: str) -> float:
    """A figure of a plan by its dotted path: `mem_per_device_gib.total`."""
    return reduce(lambda d, key: d[key], path.split("."), plan)


def planned_figures(case: dict[str, Any]) -> dict[str, float]:
    """Each of the case's figures as the planner gives it now, rounded as the table keeps it."""
    from tests.helpers.jobs import planned

    plan = planned("mode=plan", *case["overrides"])
    return {
        path: round(figure(plan, path), kept["digits"]) for path, kept in case["figures"].items()
    }


def update() -> list[str]:
    """Rewrite every value in place (the comments and the cases' order kept); returns what moved."""
    text, table, moved = TABLE.read_text(), load(), []
    for name, case in table["cases"].items():
        for path, now in planned_figures(case).items():
            was = case["figures"][path]["value"]
            if now != was:
                moved.append(f"{name} {path}: {was} -> {now}")
                case["figures"][path]["value"] = now
    header = "".join(line for line in text.splitlines(keepends=True) if line.startswith("#"))
    TABLE.write_text(header + yaml.safe_dump(table, sort_keys=False, width=100))
    return moved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--update", action="store_true", help="rewrite the table's values")
    if not parser.parse_args().update:
        parser.error("the table is rewritten only on purpose: pass --update")
    for line in update() or ["nothing moved"]:
        print(line)


if __name__ == "__main__":
    main()
