"""Context parallelism's traffic: the ring attention's sends (runner/layouts/context/ring.py),
each rank to the next, per block and micro-batch: cp-1 exchanges of its keys and values forward
and cp-1 backward, in what attention computes in (16 bits under mixed precision), and cp of their
gradients, fp32. Full recomputation runs the forward's once more, in backward. A P2P byte crosses
one link once: payload and bytes on the wire are the same."""

from __future__ import annotations

from runner.job import Job
from runner.layouts.traffic import Traffic
from runner.precision import precision_of


def traffic(job: Job) -> Traffic:
    mesh = job.mesh
    if mesh.cp < 2:
        return Traffic()
    samples = job.batch_size // mesh.dp  # a replica's, over its micro-batches
    kv, calls = job.spec.cp_traffic(
        job.model, job.data, samples, job.microbatches, mesh.cp, mesh.tp
    )
    forward = precision_of(job.trainer).activation_bytes
    passes = 2 + (job.trainer.recompute == "full")  # forward, backward, a forward again
    keys = kv * (mesh.cp - 1) * passes * forward
    grads = kv * mesh.cp * 4
    exchanges = (mesh.cp - 1) * passes + mesh.cp
    return Traffic({"cp": (keys + grads) / mesh.pp}, {"cp": calls * exchanges / mesh.pp})
