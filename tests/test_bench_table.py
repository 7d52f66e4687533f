"""`make bench`'s table: how a figure is judged against its target, and the probe that leaves a
raw ratio unjudged where the host's speed moved more than the target's margin between runs."""

import pytest

from benchmarks.__main__ import met
from benchmarks.common import drift, raw_target


def test_drift_is_the_rounds_median_distance_from_their_median() -> None:
    # median 1.0; distances 0.1, 0 and 0.2: their median 0.1. A constant offset is no drift.
    assert drift([0.9, 1.0, 1.2]) == pytest.approx(0.1)
    assert drift([0.8, 0.8, 0.8]) == 0


def test_a_raw_target_is_judged_only_within_its_margin() -> None:
    assert raw_target(">= 0.95", 0.04) == ">= 0.95"  # moved 4 %, the margin 5 %
    unjudged = raw_target(">= 0.98", 0.04)  # the margin 2 %
    assert unjudged.startswith(">= 0.98, not judged") and "4 %" in unjudged
    assert met("0.5", unjudged) == "not judged"
    assert (met("0.94", ">= 0.95"), met("0.96", ">= 0.95")) == ("**no**", "yes")


def test_a_range_target_is_judged_at_both_ends() -> None:
    assert [met(v, "0.85 to 1.15") for v in ("0.84", "0.85", "1.15", "1.234")] == [
        "**no**", "yes", "yes", "**no**"
    ]  # fmt: skip
    assert met("3.0", "none") == ""
