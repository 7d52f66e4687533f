"""What a link delivered to a data-parallel run's all-reduces, read from its timeline
(timeline.trace.json): each step's all-reduces from the later rank's launch of each, as
nccl-tests times a collective after a barrier. The run's own comm_busbw_gbs times each rank's
call from its own launch, so a rank's wait for a late peer counts as in flight (on a busy 2-core
host, a fifth of the time)."""

from __future__ import annotations

import json
from pathlib import Path

from mlflow import MlflowClient

from runner.intervals import union_s


def delivered_gbs(client: MlflowClient, run_id: str, folder: Path, nbytes: float) -> float:
    """The bus bandwidth of the best step's all-reduces (2 ranks: bus bytes = payload), GB/s: what
    the link carries when the host's other work leaves the ranks alone."""
    return nbytes / min(busy_s(client, run_id, folder)) / 1e9


def busy_s(client: MlflowClient, run_id: str, folder: Path) -> list[float]:
    """Each timeline step's time with its all-reduces in flight on both of its 2 ranks: DDP's
    buckets, a step's set ending at its optimizer's step."""
    trace = client.download_artifacts(run_id, "timeline.trace.json", str(folder))
    events = [e for e in json.loads(Path(trace).read_text())["traceEvents"] if e.get("ph") == "X"]
    ranks = [
        [
            (e["ts"], e["ts"] + e["dur"])
            for e in events
            if e["tid"] == r and e["name"] == "all-reduce"
        ]
        for r in (0, 1)
    ]
    joined = [(max(a[0], b[0]), max(a[1], b[1])) for a, b in zip(*ranks, strict=True)]
    steps = sum(e["tid"] == 0 and e["name"] == "optimizer" for e in events)
    n = len(joined) // steps
    return [
        union_s([(s / 1e6, e / 1e6) for s, e in joined[i : i + n]])
        for i in range(0, len(joined), n)
    ]
