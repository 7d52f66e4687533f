"""Context parallelism's traffic: the ring attention's sends (runner/layouts/context/ring.py),
each rank to the next, per block and micro-batch: cp-1 exchanges of its keys and values forward
and cp-1 backward, in what attention computes in (16 bits under mixed precision), and cp of their
gradients, fp32. Recomputation, full or selective, runs the forward's once more, in backward. A
P2P byte crosses one link once: payload and bytes on the wire are the same."""

from __future__ import annotations

from runner.job import Job
from runner.layouts.traffic import Traffic
from runner.precision import precision_of

Phase = tuple[float, float]  # bytes a rank sends and its exchanges, a step (means over pp ranks)


def ring_phases(job: Job) -> tuple[Phase, Phase, Phase]:
    """The sends beside forward's attention (and recomputation's), beside backward's, and of
    those every block's and micro-batch's last exchange of gradients, which the ring sends when
    the block's compute is done."""
    # Selective recomputation keeps DTensor's collectives, not the ring's sends: both run them again
    mesh, again = job.mesh, job.trainer.recompute != "none"
    samples = job.batch_size // mesh.dp  # a replica's, over its micro-batches
    kv, calls = job.spec.cp_traffic(
        job.model, job.data, samples, job.microbatches, mesh.cp, mesh.tp
    )
    keys = kv * (mesh.cp - 1) * precision_of(job.trainer).activation_bytes / mesh.pp
    grads, calls = kv * 4 / mesh.pp, calls / mesh.pp  # one exchange's
    return (
        (keys * (1 + again), calls * (mesh.cp - 1) * (1 + again)),
        (keys + grads * mesh.cp, calls * (2 * mesh.cp - 1)),
        (grads, calls),
    )


def traffic(job: Job) -> Traffic:
    if job.mesh.cp < 2:
        return Traffic()
    (forward, ahead), (backward, behind), _ = ring_phases(job)
    return Traffic({"cp": forward + backward}, {"cp": ahead + behind})
