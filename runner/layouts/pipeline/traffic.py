"""A pipeline's traffic and bubble: each boundary carries every sample's activation forward and its
gradient back, once, in what the model's layers hand each other (its spec says: 16 bits under
mixed precision, or an fp32 residual stream); every tensor-parallel rank of a stage sends its own
copy (under sequence parallelism, its positions' share); every context-parallel rank its
positions' share. The first and last stage sum a tied weight's gradient."""

from __future__ import annotations

from runner.job import Job
from runner.layouts.traffic import Traffic
from runner.precision import PARAM_BYTES, precision_of


def bubble_fraction(stages: int, microbatches: int, virtual: int = 1) -> float:
    """Idle share of a pipeline step: (p - 1) / (v*m + p - 1), p stages, m micro-batches."""
    return (stages - 1) / (virtual * microbatches + stages - 1)


def pipeline_bubble(job: Job) -> float:
    if job.mesh.pp < 2:
        return 0.0
    return bubble_fraction(job.mesh.pp, job.parallel.microbatches, job.parallel.virtual_stages)


def traffic(job: Job) -> Traffic:
    mesh = job.mesh
    if mesh.pp < 2:
        return Traffic()
    messages = message_bytes(job)
    sends = 2 * job.parallel.microbatches * len(messages)  # per replica and shard
    p2p = 2 * job.parallel.microbatches * sum(messages) / mesh.pp
    tied, calls = tied_share(job)
    return Traffic({"pp": p2p + tied}, {"pp": sends / mesh.pp + calls})


def message_bytes(job: Job) -> list[float]:
    """What one micro-batch sends across each boundary, each way, from one rank: its replica's and
    shard's share (under sequence parallelism each tensor-parallel rank sends its positions
    only)."""
    precision = precision_of(job.trainer)
    elem = job.spec.between_layers_bytes(precision.activation_bytes, precision.stream_bytes)
    mesh = job.mesh
    shards = mesh.tp if job.parallel.sequence_parallel else 1
    samples = job.batch_size / job.parallel.microbatches / (mesh.dp * mesh.cp * shards)
    return [samples * n * elem for n in job.spec.boundary_elements(job.model, job.data, job.stages)]


def tied_bytes(job: Job) -> float:
    """The gradient of the weight a model's first and last layers share (the decoder's embedding,
    its output layer too) that a pipeline's first and last stage sum every step (Megatron's
    embedding all-reduce): each tensor-parallel rank its shard, over pp's link; under FSDP
    (parallel.shard gradients or full) each data-parallel rank its shard of that."""
    if job.mesh.pp < 2:
        return 0.0
    sharded = job.mesh.size("dp") if job.shard != "none" else 1
    return job.spec.tied_elements(job.model, job.mesh.tp, job.vocab_tp) * PARAM_BYTES / sharded


def tied_share(job: Job) -> tuple[float, float]:
    """The tied weight's sum in pp's traffic, payload and calls: 2 of pp ranks, once each (the
    mean over ranks, as every payload here)."""
    tied = tied_bytes(job)
    return (2 * tied / job.mesh.pp, 2 / job.mesh.pp) if tied else (0.0, 0.0)
