"""Tensor parallelism's traffic: the model's spec counts the activations its split layers
all-reduce per sample (Megatron: 2 of b*s*h forward and 2 backward per block); a replica's
micro-batches run them all; each stage's shards carry their own layers' share."""

from __future__ import annotations

from runner.job import Job
from runner.layouts.traffic import Traffic


def traffic(job: Job, elem: int) -> Traffic:
    mesh = job.mesh
    if mesh.tp < 2:
        return Traffic()
    samples = job.batch_size // mesh.dp  # a replica's, over its micro-batches
    spec, micro = job.spec, job.microbatches
    elements, calls = spec.tp_traffic(job.model, job.data, samples, job.stages, micro)
    return Traffic({"tp": elements * elem / mesh.pp}, {"tp": calls / mesh.pp})
