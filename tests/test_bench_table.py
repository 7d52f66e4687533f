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


def test_a_benchmark_that_fails_is_a_row_and_the_others_results_are_kept(
    monkeypatch: pytest.MonkeyPatch, tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    import subprocess
    import sys

    from benchmarks import __main__ as bench

    said = {  # what each benchmark's process printed, and its exit code
        "fine": ("a figure: 1.5 (target > 1)\n", "", 0),
        "broken": ("", "python -m runner ... still ran after 600 s:\nmore\n", 1),
        "bars": ("worst |x - 1|: 0.1 (target <= 0.2)\n", "", 0),
    }

    def fake_run(command: list[str], **_: object) -> subprocess.CompletedProcess:
        out, err, code = said[command[-1].removeprefix("benchmarks.")]
        return subprocess.CompletedProcess(command, code, out, err)

    page = tmp_path / "benchmarks.md"
    page.write_text(f"before\n{bench.MARKERS[0]}\nold\n{bench.MARKERS[1]}\nafter\n")
    monkeypatch.setattr(bench.subprocess, "run", fake_run)
    monkeypatch.setattr(bench, "BENCHMARKS", ["broken", "fine", "bars"])
    monkeypatch.setattr(bench, "PAGE", page)
    monkeypatch.setattr(sys, "argv", ["benchmarks", "--docs"])
    with pytest.raises(SystemExit) as ended:
        bench.main()
    assert "broken" in str(ended.value.code)  # a failure, named
    written = page.read_text()
    assert "| fine | a figure | 1.5 | > 1 | yes |" in written  # kept, and on the page
    assert "| bars | worst \\|x - 1\\| | 0.1 | <= 0.2 | yes |" in written  # one cell, its bars kept
    assert "| broken | failed: python -m runner ... still ran after 600 s: |" in written
    assert written.startswith("before\n") and written.endswith("after\n") and "old" not in written
