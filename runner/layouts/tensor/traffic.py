"""Tensor parallelism's traffic: the model's spec counts the activations its split layers
all-reduce per sample (Megatron: 2 of b*s*h forward and 2 backward per block); a replica's
micro-batches run them all; each stage's shards carry their own layers' share.

Under mixed precision the forward all-reduces sum the split layers' 16-bit outputs; the backward
ones sum gradients of the layers' inputs, in what the layers hand each other (the model's spec: a
transformer's fp32 residual stream, whose blocks all-reduce as much backward as forward). A
vocabulary split over the ranks adds its own collectives, fp32 at every precision. Full activation
recomputation runs the forward all-reduces once more, in backward, at the forward's precision."""

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
    payload = elements * elem
    if job.vocab_tp:
        vocab, vocab_calls = spec.vocab_tp_traffic(job.model, job.data, samples, job.stages, micro)
        payload, calls = payload + vocab * 4, calls + vocab_calls
    mode = job.trainer.recompute  # full recomputation re-runs forward all-reduces in backward
    again, again_calls = spec.tp_recompute_traffic(
        job.model, job.data, samples, job.stages, micro, mode
    )
    payload, calls = payload + again * forward, calls + again_calls
    return Traffic({"tp": payload / mesh.pp}, {"tp": calls / mesh.pp})
