"""Megatron-LM's scatter/gather between pipeline stages (Narayanan et al. 2021, section 4.1):
the tensor-parallel ranks of a stage hold the same activation, so rather than each sending all of
it to its peer in the next stage (over the slower inter-node link, typically), each sends 1/tp
and the receiving group all-gathers the pieces over its own, faster tensor-parallel link.
Planned only (plan.scatter_gather): training runs send the whole activation."""

from __future__ import annotations

from dataclasses import replace

from runner.job import Job
from runner.layouts.pipeline.traffic import tied_share
from runner.layouts.traffic import Traffic


def scatter_gather(job: Job, moved: Traffic) -> Traffic:
    t = job.mesh.tp
    if t < 2 or "pp" not in moved.payload:
        return moved
    tied, sums = tied_share(job)  # the first and last stage's sum of a tied weight: as it was
    sent = moved.payload["pp"] - tied
    # Each rank all-gathers what it receives (as much as it sends). An all-gather of S bytes over
    # t ranks puts (t-1)/t * S on each rank's wire, the planner prices tp payloads as all-reduces
    # (2(t-1)/t of the payload): so S/2 of all-reduce payload, one call per receive.
    payload = moved.payload | {"pp": sent / t + tied, "tp": moved.payload.get("tp", 0.0) + sent / 2}
    calls = moved.calls | {"tp": moved.calls.get("tp", 0.0) + moved.calls["pp"] - sums}
    return replace(moved, payload=payload, calls=calls)
