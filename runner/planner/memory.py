"""Memory per device: weights, gradients, optimizer state and activations, on the busiest rank.

Weights and gradients at the training dtype; AdamW keeps two fp32 moments (and, with bf16, an
fp32 master copy of the weights: mixed precision). Activations as the model's spec counts them
(the decoder's: Korthikanti et al. 2022) for the micro-batches a stage holds in flight: the first
pipeline stage holds min(m, p) micro-batches under 1F1B, all m under GPipe.
"""

from __future__ import annotations

from runner.job import Job
from runner.models.spec import Activations

DTYPE_BYTES = {"fp32": 4, "bf16": 2}
GIB = 2**30


def optimizer_bytes_per_param(optimizer: str, dtype: str) -> int:
    moments = 8 if optimizer == "adamw" else 0
    master = 4 if dtype == "bf16" else 0
    return moments + master


def params_per_device(job: Job) -> int:
    """The most any rank holds: its stages' parameters, tensor-parallel layers split."""
    mesh, last = job.mesh, len(job.stages) - 1
    counts = [
        sum(job.spec.stage_tensors(job.model, s, i in (0, last), mesh.tp))
        for i, s in enumerate(job.stages)
    ]
    return max(sum(counts[r :: mesh.pp]) for r in range(mesh.pp))  # stage s sits on rank s % pp


def in_flight(job: Job) -> int:
    p, m = job.parallel, job.microbatches
    return m if p.schedule == "gpipe" else min(m, job.mesh.pp * p.virtual_stages)


def activation_bytes(job: Job, dtype: str, recompute: bool) -> float:
    held = Activations(
        micro=job.batch_size // (job.mesh.dp * job.microbatches),
        seq_len=job.data.get("seq_len", 0),
        layers=max(len(s) for s in job.stages),
        in_flight=in_flight(job),
        tp=job.mesh.tp,
        elem=DTYPE_BYTES[dtype],
        recompute=recompute,
    )
    return job.spec.activation_bytes(job.model, held)


def memory_per_device_gib(job: Job, dtype: str, recompute: bool = False) -> dict[str, float]:
    params, elem = params_per_device(job), DTYPE_BYTES[dtype]
    out = {
        "weights": params * elem / GIB,
        "gradients": params * elem / GIB,
        "optimizer_state": params * optimizer_bytes_per_param(job.trainer.optimizer, dtype) / GIB,
        "activations": activation_bytes(job, dtype, recompute) / GIB,
    }
    return out | {"total": sum(out.values())}


def largest_layer_gib(job: Job, dtype: str) -> float:
    """One layer (a block, the embedding, or a Linear), as tensor parallelism splits it, with its
    gradients and optimizer state: the least any device must hold."""
    params = job.spec.largest_layer_params(job.model, job.mesh.tp)
    per_param = 2 * DTYPE_BYTES[dtype] + optimizer_bytes_per_param(job.trainer.optimizer, dtype)
    return params * per_param / GIB
