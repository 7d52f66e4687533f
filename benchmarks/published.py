"""The planner against a published series of large runs: Megatron-LM's GPT models from 1.7 B to
1 T parameters on up to 3,072 A100s (Narayanan et al. 2021, "Efficient Large-Scale Language
Model Training on GPU Clusters Using Megatron-LM", Table 1: NVIDIA Selene, DGX A100 nodes with 8
x 200 Gb/s InfiniBand; bf16 mixed precision, activation recomputation, sequence 2,048, vocabulary
51,200; the scatter/gather between stages on). Their attention was unfused, before flash
attention: two batched products over the whole s x s square around a fused scale-mask-softmax
kernel, the scores kept (trainer.attention=math).

Each row is planned as published (its tensor, pipeline and data-parallel sizes, its global batch)
on the dgx_a100 profile, with micro-batches of one sample (an assumption: the table gives none)
and the plain 1F1B schedule. The paper's figure is teraFLOP/s per GPU counted by its equation
(3), which includes the recomputed forward: 96 B s l h^2 (1 + s/6h + V/16lh) FLOPs a step; the
planner's step time gives the same count's rate. Prints a Markdown table (docs/planner.md keeps
it) and the median and largest |error|.
Then H100 runs: Llama 3 405B's Table 4 (Dubey et al. 2024, "The Llama 3 Herd of Models": 8,192
and 16,384 H100s of 80 GB at 700 W, BF16; t, cp, p, d, sequence and batch per replica as
published; TFLOP/s per GPU as published), planned on `h100_cluster` with `model=llama3_405b`
(grouped-query attention with 8 key/value heads; SwiGLU's three 53,248-wide matrices as a ReLU
FFN 79,872 wide, the same weights and products) and what the paper says it ran (section 3.3.2):
bf16 mixed precision, FSDP over the replicas (parallel.shard=full), an interleaved schedule
(its v not given: 4 stages a rank assumed) with asynchronous point-to-point sends, and "sequences
of 8K tokens without activation checkpointing" (trainer.recompute=none; assumed at 131K too,
whose ranks hold 8K positions each under cp 16); one sequence a micro-batch (assumed). The
paper's TFLOP/s are model FLOPs (its MFU of 38-43 %), counted here as the planner counts them,
6 per parameter and token and 12 x layers x sequence x d_model for attention (PaLM's, Megatron's
and torchtitan's count: the whole s x s square). Target (issue 33): median |error| <= 10 %,
each row <= 20 %.
Usage: .venv/bin/python -m benchmarks.published
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from statistics import median
from typing import Any

from benchmarks.plain_loop import config
from runner.job import resolve_job
from runner.metrics import PLAN_MFU, PLAN_STEP_TIME
from runner.planner import plan
from runner.planner.timing import model_flops_per_step
from runner.validate import validate

SEQ, VOCAB = 2048, 51200


@dataclass(frozen=True)
class Row:
    params_b: float
    heads: int
    hidden: int
    layers: int
    tp: int
    pp: int
    gpus: int
    batch: int
    tflops: float  # achieved teraFLOP/s per GPU, as published


TABLE_1 = [
    Row(1.7, 24, 2304, 24, 1, 1, 32, 512, 137),
    Row(3.6, 32, 3072, 30, 2, 1, 64, 512, 138),
    Row(7.5, 32, 4096, 36, 4, 1, 128, 512, 142),
    Row(18.4, 48, 6144, 40, 8, 1, 256, 1024, 135),
    Row(39.1, 64, 8192, 48, 8, 2, 512, 1536, 138),
    Row(76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140),
    Row(145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148),
    Row(310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155),
    Row(529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163),
    Row(1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163),
]


def overrides(row: Row) -> list[str]:
    dp = row.gpus // (row.tp * row.pp)
    return [
        "mode=plan", "model=decoder", "hardware=dgx_a100", f"hardware.nodes={row.gpus // 8}",
        f"model.d_model={row.hidden}", f"model.n_heads={row.heads}", f"model.n_layers={row.layers}",
        f"model.context_len={SEQ}", f"data.vocab_size={VOCAB}", f"data.batch_size={row.batch}",
        f"parallel.tp={row.tp}", f"parallel.pp={row.pp}", f"parallel.dp={dp}",
        f"parallel.microbatches={row.batch // dp}", "trainer.precision=bf16-mixed",
        "trainer.recompute=full", "plan.scatter_gather=true", "trainer.attention=math",
    ]  # fmt: skip


def planned(row: Row) -> dict:
    cfg = config(overrides(row))
    validate(cfg)
    return plan(resolve_job(cfg))


def equation_3_flops(row: Row) -> float:
    """Megatron-LM's FLOPs per step, the recomputed forward included."""
    b, s, layers, h = row.batch, SEQ, row.layers, row.hidden
    return 96 * b * s * layers * h**2 * (1 + s / (6 * h) + VOCAB / (16 * layers * h))


def compare(row: Row) -> dict[str, float]:
    out = planned(row)
    tflops = equation_3_flops(row) / out[PLAN_STEP_TIME.name] / row.gpus / 1e12
    return {"tflops": tflops, "error": tflops / row.tflops - 1, PLAN_MFU.name: out[PLAN_MFU.name]}


def error_table(
    header: tuple[str, str],
    rows: list[Any],
    compare: Callable[[Any], dict],
    cells: Callable[[Any, dict], str],
) -> tuple[str, list[float]]:
    """A Markdown table of published rows against their plans (`header`: the columns' names and
    alignments, `cells`: a row's, from the row and its comparison), and each row's error."""
    lines = list(header)
    errors = []
    for row in rows:
        c = compare(row)
        errors.append(c["error"])
        lines.append(cells(row, c))
    return "\n".join(lines), errors


def table(rows: list[Row]) -> tuple[str, list[float]]:
    return error_table(
        (
            "| params (B) | t | p | GPUs | batch | published TFLOP/s | planned | error | "
            "planned MFU |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ),
        rows,
        compare,
        lambda row, c: (
            f"| {row.params_b:,.1f} | {row.tp} | {row.pp} | {row.gpus:,} | {row.batch:,} | "
            f"{row.tflops:.0f} | {c['tflops']:.0f} | {c['error']:+.1%} | {c[PLAN_MFU.name]:.1%} |"
        ),
    )


@dataclass(frozen=True)
class H100Row:
    gpus: int
    tp: int
    cp: int
    pp: int
    dp: int
    seq: int
    per_replica: int  # sequences a replica takes a step
    tflops: float  # teraFLOP/s per GPU, as published


LLAMA3_TABLE_4 = [
    H100Row(8192, 8, 1, 16, 64, 8192, 32, 430),
    H100Row(16384, 8, 1, 16, 128, 8192, 16, 400),
    H100Row(16384, 8, 16, 16, 8, 131072, 16, 380),
]


def h100_overrides(row: H100Row) -> list[str]:
    return [
        "mode=plan", "model=llama3_405b", "hardware=h100_cluster",
        f"hardware.nodes={row.gpus // 8}",
        f"model.context_len={row.seq}", f"data.batch_size={row.per_replica * row.dp}",
        f"parallel.tp={row.tp}", f"parallel.cp={row.cp}", f"parallel.pp={row.pp}",
        f"parallel.dp={row.dp}", "parallel.shard=full", f"parallel.microbatches={row.per_replica}",
        "parallel.schedule=interleaved_1f1b", "parallel.virtual_stages=4",
        "trainer.precision=bf16-mixed", "trainer.recompute=none",
    ]  # fmt: skip


def h100_compare(row: H100Row) -> dict:
    """A row planned: its TFLOP/s per GPU (model FLOPs over the planned step), error, bound and
    memory per device."""
    cfg = config(h100_overrides(row))
    validate(cfg)
    job = resolve_job(cfg)
    out = plan(job)
    tflops = model_flops_per_step(job) / out[PLAN_STEP_TIME.name] / row.gpus / 1e12
    memory = out["mem_per_device_gib"]["total"]
    return {"tflops": tflops, "error": tflops / row.tflops - 1, "bound": out["bound"],
            "memory_gib": memory}  # fmt: skip


def h100_table() -> tuple[str, list[float]]:
    return error_table(
        (
            "| GPUs | t x cp x p x d | sequence | published TFLOP/s | planned | error | "
            "planned GiB a GPU |",
            "|---:|---|---:|---:|---:|---:|---:|",
        ),
        LLAMA3_TABLE_4,
        h100_compare,
        lambda row, c: (
            f"| {row.gpus:,} | {row.tp} x {row.cp} x {row.pp} x {row.dp} | {row.seq:,} | "
            f"{row.tflops:.0f} | {c['tflops']:.0f} | {c['error']:+.1%} | {c['memory_gib']:.0f} |"
        ),
    )


def sixteen_bit(row: H100Row) -> list[str]:
    """A row as large runs hold it: 16-bit weights over fp32 masters, and Megatron's sequence
    parallelism beside its tp (and its cp)."""
    precision = [o for o in h100_overrides(row) if not o.startswith("trainer.precision=")]
    return [*precision, "trainer.precision=bf16-true", "parallel.sequence_parallel=true"]


def h100_memory_table() -> str:
    """Each Table 4 row's planned memory a GPU under bf16-true, part by part (GiB)."""
    names = ["weights", "master_weights", "gradients", "optimizer_state", "activations", "total"]
    lines = ["| GPUs | t x cp x p x d | sp | " + " | ".join(names) + " | fits 80 GB |",
             "|---:|---|---|" + "---:|" * (len(names) + 1)]  # fmt: skip
    for row in LLAMA3_TABLE_4:
        cfg = config(sixteen_bit(row))
        validate(cfg)
        mem = plan(resolve_job(cfg))["mem_per_device_gib"]
        cells = " | ".join(f"{mem[n]:.1f}" for n in names)
        lines.append(f"| {row.gpus:,} | {row.tp} x {row.cp} x {row.pp} x {row.dp} | "
                     f"yes | {cells} | "
                     f"{'yes' if mem['total'] <= 80 else 'no'} |")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    text, errors = table(TABLE_1)
    print(text)
    absolute = [abs(e) for e in errors]
    print(f"median |error| {median(absolute):.1%}, largest {max(absolute):.1%}")
    text, errors = h100_table()
    print(text)
    absolute = [abs(e) for e in errors]
    print(f"median |error| {median(absolute):.1%}, largest {max(absolute):.1%}")
    print(h100_memory_table())


if __name__ == "__main__":
    main()
