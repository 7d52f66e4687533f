"""A parallel layout's run, judged as the suite judges every new dimension: its losses equal the
single process's, each dimension's bytes as measured equal the planner's, exactly, and nothing
else sent any; and what its timeline trace shows on a rank."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mlflow import MlflowClient

from tests.helpers.metrics import assert_registered
from tests.helpers.records import all_runs, losses_by_step


def assert_equal_and_counted(
    store: str, single: list[float], name: str, dims: set[str], relative: float
) -> object:
    """The newest run in `store`: losses within `relative` of `single`'s, and the bytes of
    exactly `dims` equal to their predictions. Returns the run."""
    run = max(all_runs(store), key=lambda r: r.info.start_time)
    assert losses_by_step(store, run.info.run_id) == pytest.approx(single, rel=relative), name
    m = run.data.metrics
    for dim in dims:  # measured from what ran, predicted from the formulas
        key = f"comm_bytes_per_step/{dim}"
        assert m[key] == m[f"pred/{key}"], (name, key, m[key], m[f"pred/{key}"])
    assert {k.split("/")[1] for k in m if k.startswith("comm_bytes_per_step")} == dims, name
    assert_registered(run)
    return run


def shown_on_timeline(store: str, run_id: str, folder: Path, rank: int) -> set[str]:
    """The kinds of span a rank's row of the run's timeline trace shows."""
    trace = MlflowClient(store).download_artifacts(run_id, "timeline.trace.json", str(folder))
    events = json.loads(Path(trace).read_text())["traceEvents"]
    return {e["name"] for e in events if e.get("ph") == "X" and e["tid"] == rank}
