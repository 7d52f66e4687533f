"""The planner against NVIDIA's published FP8 runs on DGX-H100: Megatron-Bridge's performance
summary (github.com/NVIDIA-NeMo/Megatron-Bridge at 067f987, docs/performance-summary-archive.md;
the current docs/performance-summary.md lists Blackwell systems only). Its dense models on H100
are Llama 3 8B, 70B and 3.1 405B, all in FP8 (no dense BF16 row on H100 in any release); each
model's latest release whose TFLOP/s and tokens/s agree is taken: 8B from 25.11 ("FP8-CS",
current scaling), 70B from 26.04, 405B from 26.06. Sequence 8,192, one sequence a micro-batch.

Each row is planned as published: its GPUs, TP, PP, CP, virtual stages and global batch on
`h100_cluster` with `trainer.precision=fp8` (16-bit weights over fp32 masters, the blocks'
linear layers in float8: tensorwise scaling is current scaling), FSDP over the replicas where the
row says FSDP (8B), Megatron's distributed optimizer otherwise (`parallel.shard=optimizer`),
sequence parallelism beside TP (and CP, as Megatron's), the
interleaved schedule, no recomputation (Megatron-Bridge's performance recipes recompute nothing
for these). The models as `model=decoder` takes them: grouped-query attention with 8 key/value
heads, SwiGLU's three f-wide matrices as a ReLU FFN 1.5 f wide (the same weights and products),
vocabulary 128,256. Assumed where the table is silent: everything above but the row's columns.

Their model TFLOP/s count (Megatron-Bridge's src/megatron/bridge/training/utils/flop_utils.py;
the docs say only "model floating-point operations per second"): 6 per weight of every matrix
product (the output layer's included) and token, and 6 x layers x heads x head size x sequence
for attention (the causal half of the square). Published tokens/s times that count reproduces
the published TFLOP/s within 0.1 %, so the planned step is turned into TFLOP/s by the same count.
Target (issue 45): median |error| <= 10 %, every row <= 20 %.
Usage: .venv/bin/python -m benchmarks.megatron_bridge
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import median

from benchmarks.plain_loop import config
from benchmarks.published import error_table
from runner.job import resolve_job
from runner.metrics import PLAN_STEP_TIME
from runner.planner import plan
from runner.validate import validate

SEQ, VOCAB, KV_HEADS = 8192, 128256, 8


@dataclass(frozen=True)
class Llama:
    hidden: int
    layers: int
    heads: int
    swiglu: int  # each of SwiGLU's three matrices' width

    @property
    def flops_per_token(self) -> float:
        """Megatron-Bridge's count (the module's docstring)."""
        head = self.hidden // self.heads
        attention = self.hidden * (2 * self.hidden + 2 * KV_HEADS * head)  # Q, O; K, V
        weights = self.layers * (attention + 3 * self.hidden * self.swiglu) + VOCAB * self.hidden
        return 6 * weights + 6 * self.layers * self.heads * head * SEQ


LLAMA_8B = Llama(4096, 32, 32, 14336)
LLAMA_70B = Llama(8192, 80, 64, 28672)
LLAMA_405B = Llama(16384, 126, 128, 53248)


@dataclass(frozen=True)
class BridgeRow:
    name: str
    model: Llama
    release: str
    gpus: int
    tp: int
    pp: int
    cp: int
    vp: int
    batch: int  # global batch, sequences
    fsdp: bool
    tflops: float  # model TFLOP/s per GPU, as published


ROWS = [
    BridgeRow("Llama 3 8B", LLAMA_8B, "25.11", 8, 1, 1, 1, 1, 128, True, 744),
    BridgeRow("Llama 3 70B", LLAMA_70B, "26.04", 64, 4, 8, 1, 5, 256, False, 734),
    BridgeRow("Llama 3.1 405B", LLAMA_405B, "26.06", 1024, 8, 8, 2, 8, 1536, False, 822),
]


def overrides(row: BridgeRow) -> list[str]:
    m, dp = row.model, row.gpus // (row.tp * row.pp * row.cp)
    interleaved = ["parallel.schedule=interleaved_1f1b", f"parallel.virtual_stages={row.vp}"]
    return [
        "mode=plan", "model=decoder", "hardware=h100_cluster", f"hardware.nodes={row.gpus // 8}",
        f"model.d_model={m.hidden}", f"model.n_layers={m.layers}", f"model.n_heads={m.heads}",
        f"model.n_kv_heads={KV_HEADS}", f"model.ffn_hidden={m.swiglu * 3 // 2}",
        f"model.vocab_size={VOCAB}", "model.dropout=0", f"model.context_len={SEQ}",
        f"data.batch_size={row.batch}", f"parallel.tp={row.tp}", f"parallel.pp={row.pp}",
        f"parallel.cp={row.cp}", f"parallel.dp={dp}", f"parallel.microbatches={row.batch // dp}",
        f"parallel.shard={'full' if row.fsdp else 'optimizer'}",
        f"parallel.sequence_parallel={row.tp > 1}",
        "trainer.precision=fp8", "trainer.recompute=none",
        *(interleaved if row.pp > 1 else []),
    ]  # fmt: skip


def compare(row: BridgeRow) -> dict[str, float]:
    cfg = config(overrides(row))
    validate(cfg)
    out = plan(resolve_job(cfg))
    tokens = row.batch * SEQ
    tflops = row.model.flops_per_token * tokens / out[PLAN_STEP_TIME.name] / row.gpus / 1e12
    return {"tflops": tflops, "error": tflops / row.tflops - 1,
            "memory_gib": out["mem_per_device_gib"]["total"]}  # fmt: skip


def table() -> tuple[str, list[float]]:
    return error_table(
        (
            "| model | release | GPUs | TP x PP x CP (VP) | published TFLOP/s | planned | error | "
            "planned GiB a GPU |",
            "|---|---|---:|---|---:|---:|---:|---:|",
        ),
        ROWS,
        compare,
        lambda row, c: (
            f"| {row.name} | {row.release} | {row.gpus:,} | {row.tp} x {row.pp} x {row.cp} "
            f"({row.vp}) | {row.tflops:.0f} | {c['tflops']:.0f} | {c['error']:+.1%} | "
            f"{c['memory_gib']:.0f} |"
        ),
    )


def main() -> None:
    text, errors = table()
    print(text)
    absolute = [abs(e) for e in errors]
    print(f"median |error| {median(absolute):.1%}, largest {max(absolute):.1%}")


if __name__ == "__main__":
    main()
