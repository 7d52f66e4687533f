"""Context parallelism's traffic: the ring attention's sends (runner/layouts/context/ring.py),
each rank to the next, per block and micro-batch: cp-1 exchanges of its keys and values forward
and cp-1 backward, in what attention computes in (16 bits under mixed precision), and cp of their
gradients, fp32. Full recomputation runs the forward's once more, in backward. A P2P byte crosses
one link once: payload and bytes on the wire are the same."""

from __future__ import annotations

from runner.job import Job
from runner.layouts.traffic import Traffic
from runner.precision import precision_of


def ring_phases(job: Job) -> tuple[float, float, float]:
    """A rank's bytes a step (means over pipeline ranks): sent beside forward's attention (and
    recomputation's), beside backward's, and of it the last exchange of gradients of every block
    and micro-batch, which the ring sends when the block's compute is done."""
    mesh = job.mesh
    samples = job.batch_size // mesh.dp  # a replica's, over its micro-batches
    kv, _ = job.spec.cp_traffic(job.model, job.data, samples, job.microbatches, mesh.cp, mesh.tp)
    keys = kv * (mesh.cp - 1) * precision_of(job.trainer).activation_bytes / mesh.pp
    full = job.trainer.recompute == "full"
    grads = kv * 4 / mesh.pp  # one exchange's
    return keys * (1 + full), keys + grads * mesh.cp, grads


def ring_calls(job: Job) -> tuple[float, float, float]:
    """The exchanges of each of ring_phases' parts (means over pipeline ranks)."""
    mesh, full = job.mesh, job.trainer.recompute == "full"
    samples = job.batch_size // mesh.dp
    _, calls = job.spec.cp_traffic(job.model, job.data, samples, job.microbatches, mesh.cp, mesh.tp)
    per_rank = calls / mesh.pp
    return per_rank * (mesh.cp - 1) * (1 + full), per_rank * (2 * mesh.cp - 1), per_rank


def traffic(job: Job) -> Traffic:
    if job.mesh.cp < 2:
        return Traffic()
    forward, backward, _ = ring_phases(job)
    calls = ring_calls(job)
    return Traffic({"cp": forward + backward}, {"cp": calls[0] + calls[1]})
