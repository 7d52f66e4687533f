"""Memory per device: weights, gradients, optimizer state and activations, on the busiest rank.

Weights, gradients and AdamW's two moments in fp32 at every precision: mixed precision is torch's
autocast (runner/precision.py), which adds a 16-bit copy of each weight, held from forward until
backward. (Megatron's scheme, 16-bit weights and gradients with an fp32 master copy, comes to the
same 16 bytes a parameter before the copies.) Activations as the model's spec counts them
(the decoder's: Korthikanti et al. 2022) for the micro-batches a stage holds in flight: the first
pipeline stage holds min(m, p) micro-batches under 1F1B, all m under GPipe; what each holds
depends on trainer.recompute (runner/models/recompute.py).
"""

from __future__ import annotations

from runner.job import Job
from runner.models.spec import Activations
from runner.precision import PARAM_BYTES, precision_of

GIB = 2**30


def optimizer_bytes_per_param(optimizer: str) -> int:
    return 8 if optimizer == "adamw" else 0  # two fp32 moments


def params_per_device(job: Job) -> int:
    """The most any rank holds: its stages' parameters, tensor-parallel layers split."""
    mesh, last = job.mesh, len(job.stages) - 1
    counts = [
        sum(job.spec.stage_tensors(job.model, s, i in (0, last), mesh.tp, job.vocab_tp))
        for i, s in enumerate(job.stages)
    ]
    return max(sum(counts[r :: mesh.pp]) for r in range(mesh.pp))  # stage s sits on rank s % pp


def in_flight(job: Job) -> int:
    p, m = job.parallel, job.microbatches
    return m if p.schedule == "gpipe" else min(m, job.mesh.pp * p.virtual_stages)


def activation_bytes(job: Job) -> float:
    held = Activations(
        micro=job.batch_size // (job.mesh.dp * job.microbatches),
        seq_len=job.data.get("seq_len", 0),
        layers=max(len(s) for s in job.stages),
        in_flight=in_flight(job),
        tp=job.mesh.tp,
        elem=precision_of(job.trainer).activation_bytes,
        recompute=job.trainer.recompute,
        vocab_tp=job.vocab_tp,
    )
    return job.spec.activation_bytes(job.model, held)


def memory_per_device_gib(job: Job) -> dict[str, float]:
    params, precision = params_per_device(job), precision_of(job.trainer)
    out = {
        "weights": params * PARAM_BYTES / GIB,
        "weight_copies": params * precision.weight_copy_bytes / GIB,
        "gradients": params * PARAM_BYTES / GIB,
        "optimizer_state": params * optimizer_bytes_per_param(job.trainer.optimizer) / GIB,
        "activations": activation_bytes(job) / GIB,
    }
    return out | {"total": sum(out.values())}


def largest_layer_gib(job: Job) -> float:
    """One layer (a block, the embedding, or a Linear), as tensor parallelism splits it, with its
    gradients and optimizer state: the least any device must hold."""
    params = job.spec.largest_layer_params(job.model, job.mesh.tp, job.vocab_tp)
    copy = precision_of(job.trainer).weight_copy_bytes
    per_param = 2 * PARAM_BYTES + copy + optimizer_bytes_per_param(job.trainer.optimizer)
    return params * per_param / GIB
