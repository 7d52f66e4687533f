"""Parallel layouts: each takes the plain model as it is and decides how it runs on many devices.

A technique is one folder: its part of a Lightning strategy, the probe that measures what it runs,
and the traffic the planner predicts for it. The device mesh (runner/mesh.py) says which strategy
runs (runner/layouts/strategy.py): data-parallel replicas only is Lightning's DDP (data/); any
tensor-parallel split (tensor/), or replicas that shard their state (sharded/), is the mesh
strategy, which composes the techniques' parts (mesh_strategy.py); any pipeline is the pipeline
strategy (pipeline/), which splits its stages over tp and replicates them over dp the same way.
What the timing and the snapshots ask of a running layout is layout.py's. This module stays
torch-free: the planner imports it.
"""

from __future__ import annotations

from runner.job import Job
from runner.layouts.context import traffic as context_traffic
from runner.layouts.data import traffic as data_traffic
from runner.layouts.expert import traffic as expert_traffic
from runner.layouts.pipeline import traffic as pipeline_traffic
from runner.layouts.sharded import traffic as sharded_traffic
from runner.layouts.tensor import traffic as tensor_traffic
from runner.layouts.traffic import Traffic
from runner.mesh import Mesh

# DDP's all-reduce (parallel.shard none, optimizer) and the sharded levels' own collectives add
# up on dp.
TRAFFIC = (
    data_traffic.traffic,
    sharded_traffic.traffic,
    tensor_traffic.traffic,
    context_traffic.traffic,
    expert_traffic.traffic,
    pipeline_traffic.traffic,
)


def traffic(job: Job) -> Traffic:
    """Every dimension's traffic for the job's mesh, at the job's precision: the layouts' sums."""
    out = Traffic()
    for part in TRAFFIC:
        found = part(job)
        for mine, theirs in (
            (out.payload, found.payload),
            (out.calls, found.calls),
            (out.by_collective, found.by_collective),
        ):
            for key, value in theirs.items():
                mine[key] = mine.get(key, 0.0) + value
        out.tail |= found.tail
    return out


def data_shard(mesh: Mesh, rank: int) -> tuple[int, int]:
    """This rank's data-parallel index and count: only data-parallel ranks see different data."""
    return mesh.coords(rank)["dp"], mesh.dp
