"""Bytes per step from formulas: what each mesh dimension hands to collectives and P2P.

The seed's, nccl-tests' and Megatron-LM's arithmetic: payload S per collective call; a ring
all-reduce moves 2(n-1)/n * S per rank; data parallelism all-reduces every gradient a rank holds
once per step; tensor parallelism all-reduces b*s*h activations twice forward and twice backward
per block and micro-batch; a pipeline boundary carries each activation forward and its gradient
back. Per-rank figures are means over ranks (pipeline stages differ), as the runs measure them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import fmean

from omegaconf import DictConfig

from runner.mesh import Mesh, mesh_of
from runner.models.sizes import column_row_pairs, param_count, stage_layers

FP32_BYTES = 4


def ring_allreduce_bytes(payload: float, n: int) -> float:
    """Bytes each rank sends (and receives) in a ring all-reduce of `payload` bytes over n ranks."""
    return 2 * (n - 1) / n * payload


def bubble_fraction(stages: int, microbatches: int, virtual: int = 1) -> float:
    """Idle share of a pipeline step: (p - 1) / (v*m + p - 1), p stages, m micro-batches."""
    return (stages - 1) / (virtual * microbatches + stages - 1)


def is_decoder(m: DictConfig) -> bool:
    return m.get("_target_", "").endswith("Decoder")


def widths(m: DictConfig) -> list[int]:
    return [m.in_features, *m.hidden, m.out_features]


def decoder_block_tensors(d: int, tp: int) -> list[int]:
    """One block's parameter tensors on one tensor-parallel rank, in the module's order (Q, K, V,
    output, norm, up, down, norm): split layers hold 1/tp of theirs, the row-parallel biases (the
    output projection's, down's) and the norms are whole."""
    column = [d * d // tp, d // tp]  # a weight split by columns, and its bias
    attention = [*column * 3, d * d // tp, d]
    ffn = [4 * d * d // tp, 4 * d // tp, 4 * d * d // tp, d]
    return [*attention, d, d, *ffn, d, d]


def decoder_block_params(d: int, tp: int) -> int:
    return sum(decoder_block_tensors(d, tp))


def ffnn_stage_tensors(m: DictConfig, layers: range, tp: int) -> list[int]:
    """Each Linear's weight and bias on one tensor-parallel rank: a column layer holds 1/tp of
    both, a row layer 1/tp of its weight and all its bias."""
    w = widths(m)
    column = {c for c, _ in column_row_pairs(layers)} if tp > 1 else set()
    row = {c + 1 for c in column}

    def linear(i: int) -> list[int]:
        weights, bias = w[i] * w[i + 1], w[i + 1]
        if i in column:
            return [weights // tp, bias // tp]
        return [weights // tp, bias] if i in row else [weights, bias]

    return [n for i in layers for n in linear(i)]


def stage_tensors(m: DictConfig, layers: range, ends: bool, tp: int) -> list[int] | None:
    """Sizes of the trainable tensors of one stage on one rank (`ends`: it holds the first or last
    stage), in the module's order; None for a model of someone else's."""
    if is_decoder(m):
        embedding = [m.vocab_size * m.d_model] if ends else []
        return embedding + [n for _ in layers for n in decoder_block_tensors(m.d_model, tp)]
    if m.get("_target_", "").endswith("FFNN"):
        return ffnn_stage_tensors(m, layers, tp)
    if m.get("_target_", "").endswith("Neuron"):
        return [m.n_inputs, 1]  # its weights, its bias
    count = param_count(m)  # never split; None for a model of someone else's
    return None if count is None else [count]


def stage_params(m: DictConfig, layers: range, ends: bool, tp: int) -> int | None:
    """Trainable parameters of one stage on one rank (`ends`: it holds the first or last stage)."""
    tensors = stage_tensors(m, layers, ends, tp)
    return None if tensors is None else sum(tensors)


@dataclass
class Traffic:
    """Per rank and step (means over ranks): payload bytes and calls, by mesh dimension."""

    payload: dict[str, float] = field(default_factory=dict)
    calls: dict[str, float] = field(default_factory=dict)


def data_parallel(cfg: DictConfig, mesh: Mesh, stages: list[range], elem: int) -> Traffic:
    last = len(stages) - 1
    per_stage = [stage_tensors(cfg.model, s, i in (0, last), mesh.tp) for i, s in enumerate(stages)]
    if mesh.dp < 2 or None in per_stage:
        return Traffic()
    payload = sum(sum(t) for t in per_stage) * elem / mesh.pp  # every gradient a rank holds, once
    cap = cfg.parallel.bucket_cap_mb
    calls = fmean(bucket_count([n * elem for n in t], cap) for t in per_stage)
    return Traffic({"dp": payload}, {"dp": calls})


def bucket_count(tensor_bytes: list[int], cap_mb: float | None) -> int:
    """DDP's all-reduce calls a step. Gradients fill buckets in reverse module order (about the
    order backward makes them), and a bucket closes at the first tensor that takes it to its
    limit (torch's _compute_bucket_assignment_by_size): by default 1 MiB for the first bucket and
    25 MiB after it; a size that is set, for every bucket. A tensor over the limit is a bucket."""
    limits = [cap_mb * 2**20] if cap_mb is not None else [2**20, 25 * 2**20]
    closed, filled = 0, 0
    for size in reversed(tensor_bytes):
        filled += size
        if filled >= limits[min(closed, len(limits) - 1)]:
            closed, filled = closed + 1, 0
    return closed + bool(filled)


def tensor_parallel(cfg: DictConfig, mesh: Mesh, stages: list[range], elem: int) -> Traffic:
    if mesh.tp < 2:
        return Traffic()
    m, samples = cfg.model, cfg.data.batch_size // mesh.dp  # a replica's, over its micro-batches
    microbatches = cfg.parallel.microbatches if mesh.pp > 1 else 1
    if is_decoder(m):
        elements = 4 * samples * cfg.data.seq_len * m.d_model * m.n_layers
        calls = 4 * m.n_layers * microbatches
    else:
        w = widths(m)
        pairs = [pair for s in stages for pair in column_row_pairs(s)]
        # Forward: the row layer's output; backward: the column layer's input gradient, which the
        # model's first layer has none of (its input is the data).
        elements = sum(samples * (w[r + 1] + (w[c] if c else 0)) for c, r in pairs)
        calls = sum(1 + bool(c) for c, _ in pairs) * microbatches
    return Traffic({"tp": elements * elem / mesh.pp}, {"tp": calls / mesh.pp})


def boundary_elements(cfg: DictConfig, stages: list[range]) -> list[int]:
    """Elements of one sample's activation crossing each boundary between stages."""
    m = cfg.model
    if is_decoder(m):
        return [cfg.data.seq_len * m.d_model for _ in stages[1:]]
    return [widths(m)[s.start] for s in stages[1:]]


def pipeline(cfg: DictConfig, mesh: Mesh, stages: list[range], elem: int) -> Traffic:
    if mesh.pp < 2:
        return Traffic()
    # Each boundary carries every sample's activation forward and its gradient back, once; every
    # tensor-parallel rank of a stage sends its own copy.
    boundaries = boundary_elements(cfg, stages)
    total = sum(2 * cfg.data.batch_size * n * elem for n in boundaries)
    sends = 2 * cfg.parallel.microbatches * len(boundaries)  # per replica and shard
    return Traffic({"pp": total / (mesh.pp * mesh.dp)}, {"pp": sends / mesh.pp})


def traffic(cfg: DictConfig, elem: int = FP32_BYTES) -> Traffic:
    """Every dimension's traffic for the config's mesh; `elem`: bytes per element."""
    mesh, stages = mesh_of(cfg), stage_layers(cfg.model, cfg.parallel)
    out = Traffic()
    for part in (data_parallel, tensor_parallel, pipeline):
        found = part(cfg, mesh, stages, elem)
        out.payload |= found.payload
        out.calls |= found.calls
    return out
