"""Tensor parallelism's traffic: the model's spec counts the activations its split layers
all-reduce per sample (Megatron: 2 of b*s*h forward and 2 backward per block); a replica's
micro-batches run them all; each stage's shards carry their own layers' share.

Under mixed precision the forward all-reduces sum the split layers' 16-bit outputs; the backward
ones sum gradients of the layers' inputs, in what the layers hand each other (the model's spec: a
transformer's fp32 residual stream, whose blocks all-reduce as much backward as forward; over
16-bit weights all of it is 16-bit). A vocabulary split over the ranks adds its own collectives,
in the stream's width (the loss's, fp32). Full activation recomputation runs the forward
all-reduces once more, in backward, at the forward's precision.

With sequence parallelism (runner/models/decoder/parallelize.py) the blocks' all-reduces become
all-gathers and reduce-scatters, dimension "sp" on the same ranks: the same payload twice over (an
all-gather's and a reduce-scatter's each), at the same precisions; tp keeps the vocabulary's and
the all-reduces of the gradients of weights that stay whole (the norms'). Recomputed, each block's
forward gathers and scatters again: its 2 all-reduces' payload twice; with selective recomputation
it gathers again only (what it would keep is t times each rank's positions). With context
parallelism a rank's activations are its s/cp positions': a cp-th of each payload (sequence
parallelism splits those s/cp over the tp ranks, as Megatron-LM's does beside its cp), but the
norms' weights' gradients, whole."""

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
    precision = precision_of(job.trainer)
    forward, stream = precision.activation_bytes, precision.stream_bytes
    elem = (forward + spec.between_layers_bytes(forward, stream)) / 2
    # A cp rank's positions' share of what scales with positions (the norms' weights do not)
    norms = 0.0
    if job.sequence:  # the blocks' all-reduces become sequence parallelism's (sp)
        elements, calls = spec.sp_tp_traffic(job.model, micro)
        norms = elements * precision.weight_bytes  # the norms' gradients, as autograd makes them
        payload = 0.0
    else:
        elements, calls = spec.tp_traffic(job.model, job.data, samples, job.stages, micro)
        payload = elements * elem
    if job.vocab_tp:
        stream_part, logits, vocab_calls = spec.vocab_tp_traffic(
            job.model, job.data, samples, job.stages, micro, job.sequence
        )
        payload += stream_part * spec.between_layers_bytes(forward, stream) + logits * 4
        calls += vocab_calls
    mode = job.trainer.recompute  # full recomputation re-runs forward all-reduces in backward
    again, again_calls = spec.tp_recompute_traffic(
        job.model, job.data, samples, job.stages, micro, mode
    )
    if not job.sequence:
        payload, calls = payload + again * forward, calls + again_calls
        return Traffic({"tp": payload / (mesh.pp * mesh.cp)}, {"tp": calls / mesh.pp})
    blocks, ends, sp_calls = spec.sp_traffic(job.model, job.data, samples, micro, job.vocab_tp)
    sp = (
        blocks * elem + ends * stream + 2 * again * elem
    )  # recomputed: gathered and scattered again
    sp_calls += 2 * again_calls
    if mode == "selective":  # the forward's all-gathers (one a tp all-reduce), of the stream
        gathered, gathered_calls = spec.tp_recompute_traffic(
            job.model, job.data, samples, job.stages, micro, "full"
        )
        sp, sp_calls = sp + gathered * stream, sp_calls + gathered_calls
    per_rank = {"tp": payload / mesh.cp + norms, "sp": sp / mesh.cp}, {"tp": calls, "sp": sp_calls}
    return Traffic(*({d: v / mesh.pp for d, v in part.items()} for part in per_rank))
