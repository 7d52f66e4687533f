"""A pipeline's traffic and bubble: each boundary carries every sample's activation forward and its
gradient back, once, in what the model's layers hand each other (its spec says: 16 bits under
mixed precision, or an fp32 residual stream); every tensor-parallel rank of a stage sends its own
copy (under sequence parallelism, its positions' share); every context-parallel rank its
positions' share."""

from __future__ import annotations

from runner.job import Job
from runner.layouts.traffic import Traffic
from runner.precision import precision_of


def bubble_fraction(stages: int, microbatches: int, virtual: int = 1) -> float:
    """Idle share of a pipeline step: (p - 1) / (v*m + p - 1), p stages, m micro-batches."""
    return (stages - 1) / (virtual * microbatches + stages - 1)


def pipeline_bubble(job: Job) -> float:
    if job.mesh.pp < 2:
        return 0.0
    return bubble_fraction(job.mesh.pp, job.parallel.microbatches, job.parallel.virtual_stages)


def traffic(job: Job) -> Traffic:
    elem = job.spec.between_layers_bytes(precision_of(job.trainer).activation_bytes)
    mesh = job.mesh
    if mesh.pp < 2:
        return Traffic()
    boundaries = job.spec.boundary_elements(job.model, job.data, job.stages)
    total = sum(2 * job.batch_size * n * elem for n in boundaries)
    sends = 2 * job.parallel.microbatches * len(boundaries)  # per replica and shard
    # Under sequence parallelism each tensor-parallel rank sends its positions only
    shards = mesh.tp if job.parallel.sequence_parallel else 1
    return Traffic({"pp": total / (mesh.pp * mesh.dp * mesh.cp * shards)}, {"pp": sends / mesh.pp})
