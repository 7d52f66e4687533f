"""Tensor parallelism's traffic: the model's spec counts the activations its split layers
all-reduce per sample (Megatron: 2 of b*s*h forward and 2 backward per block); a replica's
micro-batches run them all; each stage's shards carry their own layers' share.

Under mixed precision the forward all-reduces sum the split layers' 16-bit outputs; the backward
ones sum gradients of the layers' inputs, in what the layers hand each other (the model's spec: a
transformer's fp32 residual stream, whose blocks all-reduce as much backward as forward)."""

from __future__ import annotations

from runner.job import Job
from runner.layouts.traffic import Traffic
from runner.precision import precision_of


def traffic(job: Job) -> Traffic:
    mesh = job.mesh
    if mesh.tp < 2:
        return Traffic()
    samples = job.batch_size // mesh.dp  # a replica's, over its micro-batches
    spec, micro = job.spec, job.microbatches
    elements, calls = spec.tp_traffic(job.model, job.data, samples, job.stages, micro)
    forward = precision_of(job.trainer).activation_bytes
    elem = (forward + spec.between_layers_bytes(forward)) / 2
    return Traffic({"tp": elements * elem / mesh.pp}, {"tp": calls / mesh.pp})
