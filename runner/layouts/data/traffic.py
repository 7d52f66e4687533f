"""Data parallelism's traffic: every gradient a rank holds is all-reduced once per step, one call
per DDP bucket, in what gradients are reduced in (fp32 but with 16-bit weights and
trainer.grad_reduce=bf16: runner/precision.py). So under parallel.shard none; the sharded levels
(FSDP2, ZeRO-1 included: runner/layouts/sharded/traffic.py) run no all-reduce."""

from __future__ import annotations

from statistics import fmean

from runner.job import Job
from runner.layouts.traffic import Traffic
from runner.memo import shared, stage_key, stages_key
from runner.precision import precision_of


def buckets(tensor_bytes: list[int], cap_mb: float | None) -> list[int]:
    """DDP's buckets' bytes, one all-reduce each, in the order it starts them. Gradients fill
    buckets in reverse module order (about the order backward makes them), and a bucket closes at
    the first tensor that takes it to its limit (torch's _compute_bucket_assignment_by_size): by
    default 1 MiB for the first bucket and 25 MiB after it; a size that is set, for every bucket.
    A tensor over the limit is a bucket."""
    limits = [cap_mb * 2**20] if cap_mb is not None else [2**20, 25 * 2**20]
    out, filled = [], 0
    for size in reversed(tensor_bytes):
        filled += size
        if filled >= limits[min(len(out), len(limits) - 1)]:
            out, filled = [*out, filled], 0
    return out + [filled] if filled else out


def bucket_count(tensor_bytes: list[int], cap_mb: float | None) -> int:
    return len(buckets(tensor_bytes, cap_mb))


def grad_bytes(job: Job) -> int:
    return precision_of(job.trainer).grad_bytes


@shared(
    key=lambda job, index, placed: stage_key(
        job, index, placed, job.parallel.bucket_cap_mb, grad_bytes(job)
    )
)
def stage_buckets(job: Job, index: int, placed: bool) -> list[int]:
    """A stage's DDP buckets, in bytes (`placed`: a mixture of experts' experts left to ep)."""
    tensors = job.stage_tensors(index, experts=not placed)
    return buckets([n * grad_bytes(job) for n in tensors], job.parallel.bucket_cap_mb)


@shared(
    key=lambda job: stages_key(
        job, job.mesh.size("dp"), job.shard, job.parallel.bucket_cap_mb, precision_of(job.trainer)
    )
)
def traffic(job: Job) -> Traffic:
    mesh, stages, elem = job.mesh, job.stages, grad_bytes(job)
    if mesh.size("dp") < 2 or job.shard != "none":
        return Traffic()
    placed = mesh.ep > 1  # DDP leaves the experts to expert parallelism
    per_stage = [job.stage_tensors(i, experts=not placed) for i in range(len(stages))]
    payload = sum(sum(t) for t in per_stage) * elem / mesh.pp  # every gradient a rank holds, once
    per_bucket = [stage_buckets(job, i, placed) for i in range(len(stages))]
    calls = fmean(len(b) for b in per_bucket)
    tail = fmean(b[-1] for b in per_bucket)
    if placed and mesh.size("dp") // mesh.ep > 1:
        # The experts' replicas sum theirs in one all-reduce after backward: exposed, as the
        # last bucket is (runner/layouts/expert/split.py)
        experts = sum(sum(job.stage_tensors(i)) - sum(t) for i, t in enumerate(per_stage))
        payload, calls = payload + experts * elem / mesh.pp, calls + 1
        tail += experts * elem / mesh.pp
    return Traffic({"dp": payload}, {"dp": calls}, {"dp": tail})
