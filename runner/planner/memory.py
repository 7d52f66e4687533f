"""Memory per device: weights, gradients, optimizer state and activations, on the busiest rank.

Under fp32 and autocast (runner/precision.py) weights, gradients and AdamW's two moments are fp32,
and autocast adds a 16-bit copy of each weight, held from forward until backward. Over 16-bit
weights (bf16-true, fp8) the layers hold 16-bit weights, the optimizer fp32 master weights beside
its moments, and gradients are accumulated in trainer.grad_reduce's width (Megatron-LM's
distributed optimizer holds 6 + 12/n bytes a parameter under ZeRO-1 with fp32 gradients; here
ZeRO-1 runs as FSDP2 without resharding after forward, whose fp32 shards are the masters and
which shards gradients as it reduces them: ZeRO-2's 2 + 16/n). Activations as
the model's spec counts them (the decoder's: Korthikanti et al. 2022) for the micro-batches a
stage holds in flight: the first pipeline stage holds min(m, p) micro-batches under 1F1B, all m
under GPipe; what each holds depends on trainer.recompute (runner/models/recompute.py).

Sharded data parallelism (parallel.shard, n = dp ranks; optimizer runs as gradients): gradients
splits the optimizer state, the masters and the gradients n ways, the weights whole (gathered
from forward to the end of backward) beside FSDP's shards of them (1/n more); full the weights
too: 1/n of them, the root's gathered (the decoder's embedding, never resharded) and two layers'
(the one computing, the one prefetched: the largest two) - unless it keeps them across
micro-batches (parallel.reshard_after_forward=never, a pipeline's default): whole, as gradients
holds them. Both add one unit's whole gradients twice, as backward makes them and as the
reduce-scatter copies them. The 16-bit copies stay whole: autocast's copy of a gathered weight is
saved for backward, which freeing the fp32 weight does not free.

The math library's workspace (hardware.workspace_mib: cuBLAS's on a GPU, the BLAS's packing buffers
on a CPU) is held from the first product on.

The peak follows the step rather than adding every part at once. Weights, optimizer state and the
workspace are resident from the first step on. Activations are held from forward until backward
frees them layer by layer as it makes the gradients, so a step peaks at one of three moments:
backward's start (every activation in flight, autocast's 16-bit weight copies and the last
layer's weight gradient, the loss's gradient taking the place of the log-probabilities it frees;
with several micro-batches also the gradients earlier ones made), backward's end (every
gradient), or the optimizer's step (every gradient and the optimizer's temporaries: torch's fused
AdamW on a GPU keeps none; its foreach path, taken by DTensor parameters, one of the rank's
parameters; its per-tensor path on a CPU, two of the largest tensor's).
"""

from __future__ import annotations

from dataclasses import replace

from runner.job import Job
from runner.layouts.sharded.traffic import regathers, units
from runner.memo import shared, stages_key
from runner.models.spec import Activations
from runner.planner.attention import fused_attention
from runner.precision import PARAM_BYTES, precision_of

GIB = 2**30


def optimizer_bytes_per_param(optimizer: str) -> int:
    return 8 if optimizer == "adamw" else 0  # two fp32 moments


@shared(key=lambda job, experts=True: stages_key(job, experts))
def params_per_device(job: Job, experts: bool = True) -> int:
    """The most any rank holds: its stages' parameters, tensor-parallel layers split, a mixture
    of experts' experts placed over ep (`experts` false: without them)."""
    mesh = job.mesh
    counts = [sum(job.stage_tensors(i, experts)) for i in range(len(job.stages))]
    return max(sum(counts[r :: mesh.pp]) for r in range(mesh.pp))  # stage s sits on rank s % pp


def in_flight(job: Job, rank: int = 0) -> int:
    """Micro-batches through one stage (one stage of a rank's v, interleaved) whose activations
    pipeline rank `rank` holds at once (the first by default, the busiest): GPipe's m, 1F1B's
    p - rank; interleaved 1F1B's are torch's warm-up forwards and the first steady one: (v - 1)
    rounds of the micro-batches a round takes, then 2 for each rank behind it
    (ScheduleInterleaved1F1B's count, at most m x v; zero bubble's, 1 for each)."""
    p, m, pp, v = job.parallel, job.microbatches, job.mesh.pp, job.parallel.virtual_stages
    if p.schedule == "gpipe":
        return m
    if p.schedule == "1f1b":
        return min(m, pp - rank)
    per_round = m // max(1, m // pp)
    behind = 2 if p.schedule == "interleaved_1f1b" else 1
    return min(m * v, (v - 1) * per_round + behind * (pp - 1 - rank) + 1)


def activation_bytes(job: Job) -> float:
    """The busiest pipeline rank's: the first's, which holds the most micro-batches in flight, or
    the last's, which holds fewer but the model's output (the decoder's fp32 logits)."""
    held, spec, pp = activations_held(job), job.spec, job.mesh.pp
    if pp == 1:
        return spec.activation_bytes(job.model, held)
    first = replace(held, output=False)
    last = replace(held, in_flight=in_flight(job, pp - 1), embedding=False)
    return max(spec.activation_bytes(job.model, first), spec.activation_bytes(job.model, last))


def activations_held(job: Job) -> Activations:
    return Activations(
        micro=job.batch_size // (job.mesh.dp * job.microbatches),
        seq_len=job.data.get("seq_len", 0),
        layers=max(len(s) for s in job.stages),
        in_flight=in_flight(job),
        tp=job.mesh.tp,
        elem=precision_of(job.trainer).activation_bytes,
        stream=precision_of(job.trainer).stream_bytes,
        recompute=job.trainer.recompute,
        vocab_tp=job.vocab_tp,
        sequence=job.sequence,
        cp=job.mesh.cp,
        fused_attention=fused_attention(job),
        mask_bytes=None if job.hardware.accelerator == "cpu" else 1,  # None: the input's dtype
    )


@shared(key=lambda job, shards, gathered: stages_key(job, job.mesh.size("dp"), shards, gathered))
def weights_held(job: Job, shards: int, gathered: int) -> float:
    """The most weight bytes any rank holds at once under ZeRO-3 (the module's docstring): its
    shards at `shards` bytes a parameter (0: they are the fp32 masters, counted apart), the units
    gathered at `gathered`."""
    n, held = job.mesh.size("dp"), [0.0] * job.mesh.pp
    for i in range(len(job.stages)):
        u = units(job, i)
        held[i % job.mesh.pp] += u.total / n * shards
        held[i % job.mesh.pp] += (u.root + sum(sorted(u.layers)[-2:])) * gathered
    return max(held)


@shared(key=stages_key)
def largest_unit(job: Job) -> int:
    """FSDP's largest unit on any rank, in parameters: backward makes its whole gradients, and the
    reduce-scatter copies them into its input before they are freed (two of it at once)."""
    return max(max([u.root, *u.layers]) for u in (units(job, i) for i in range(len(job.stages))))


def memory_per_device_gib(job: Job) -> dict[str, float]:
    """Each part at its most, and the step's peak ("total": the moment they add up most)."""
    parts = held_parts_gib(job)
    return parts | {"total": peak_gib(job, parts)}


def peak_gib(job: Job, parts: dict[str, float]) -> float:
    """The largest of backward's start, backward's end and the optimizer's step (the module's
    docstring)."""
    resident = parts["weights"] + parts["master_weights"] + parts["optimizer_state"]
    resident += parts["workspace"]
    earlier = parts["gradients"] if job.microbatches > 1 else 0.0
    start = resident + parts["weight_copies"] + parts["activations"] + earlier
    start += last_gradient_bytes(job) / GIB
    end = resident + parts["gradients"]
    return max(start, end, end + optimizer_temporaries_bytes(job) / GIB)


def last_gradient_bytes(job: Job) -> float:
    """The gradient of the layer backward starts with: the last stage's last tensor (the
    decoder's output layer, its tied embedding), a shard of it under FSDP."""
    last = job.stage_tensors(len(job.stages) - 1)
    share = job.mesh.size("dp") if job.shard != "none" else 1
    made = precision_of(job.trainer).weight_bytes  # autograd makes it in its weight's dtype
    return (max(last[:1] + last[-1:]) if last else 0) * made / share


def optimizer_temporaries_bytes(job: Job) -> float:
    """AdamW's temporaries at its step (the module's docstring); SGD keeps none."""
    if job.trainer.optimizer != "adamw":
        return 0.0
    sharded = job.mesh.size("dp") if job.shard != "none" else 1
    if job.hardware.accelerator != "cpu":
        return 0.0 if job.mesh.tp == 1 else params_per_device(job) * PARAM_BYTES / sharded
    largest = max(max(job.stage_tensors(i)) for i in range(len(job.stages)))
    return 2 * largest * PARAM_BYTES / sharded


def held_parts_gib(job: Job) -> dict[str, float]:
    params, precision = params_per_device(job), precision_of(job.trainer)
    shard, n = job.shard, job.mesh.size("dp")
    weight, grad = precision.weight_bytes, precision.grad_bytes
    # the parts a sharded level splits n ways
    split = () if shard == "none" else ("optimizer_state", "master_weights", "gradients")
    out = {
        "weights": params * weight / GIB,
        "master_weights": params * precision.master_bytes / GIB,
        "weight_copies": params * precision.weight_copy_bytes / GIB,
        "gradients": params * grad / GIB,
        "optimizer_state": params * optimizer_bytes_per_param(job.trainer.optimizer) / GIB,
        "activations": activation_bytes(job) / GIB,
        "workspace": workspace_gib(job),
    }
    out |= {part: out[part] * sharded_share(job, n) for part in split}
    # FSDP's shards are the fp32 weights, or, over 16-bit weights, the masters (counted apart)
    shards = 0 if precision.masters else weight
    if regathers(job):
        out["weights"] = weights_held(job, shards, weight) / GIB
    elif shard != "none":  # FSDP's shards, and every unit gathered beside them
        out["weights"] *= 1 + shards / weight / n
    if shard != "none" or precision.masters:  # FSDP2 (on one replica too)
        # a unit's whole gradients as backward makes them, and the reduce-scatter's input
        out["gradients"] += largest_unit(job) * (weight + grad) / GIB
    return out


def workspace_gib(job: Job) -> float:
    """The math library's buffers (hardware.workspace_mib at the precision's compute key): held
    from the first product on, whatever the layout."""
    return job.hardware.workspace_mib.get(precision_of(job.trainer).compute, 0.0) / 1024


def sharded_share(job: Job, n: int) -> float:
    """What of a rank's parameters' state sharding over the n dp ranks leaves it: 1/n, but a
    mixture of experts' placed experts shard over their n / ep replicas only."""
    if job.mesh.ep == 1:
        return 1 / n
    every, experts = params_per_device(job), params_per_device(job) - params_per_device(job, False)
    return ((every - experts) / n + experts * job.mesh.ep / n) / every


def largest_layer_gib(job: Job) -> float:
    """One layer (a block, the embedding, or a Linear), as tensor parallelism splits it, with its
    gradients and optimizer state: the least any device must hold."""
    params = job.spec.largest_layer_params(job.model, job.mesh.tp, job.vocab_tp)
    p = precision_of(job.trainer)
    held = p.weight_bytes + p.master_bytes + p.grad_bytes + p.weight_copy_bytes
    per_param = held + optimizer_bytes_per_param(job.trainer.optimizer)
    return params * per_param / GIB
