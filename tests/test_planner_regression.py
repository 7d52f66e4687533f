"""The planner held to its regression table (tests/regression/planner.yaml): the figures
docs/planner.md quotes for published-scale plans, which no test derives from a formula. A change
that moves one fails here, naming the case and the figure; rewrite the table on purpose
(tests/helpers/regression.py) and review its diff."""

from __future__ import annotations

import pytest

from tests.helpers.regression import load, planned_figures

CASES = load()["cases"]


@pytest.mark.parametrize("name", list(CASES))
def test_the_planner_gives_what_its_regression_table_keeps(name: str) -> None:
    case = CASES[name]
    kept = {path: f["value"] for path, f in case["figures"].items()}
    assert planned_figures(case) == kept
