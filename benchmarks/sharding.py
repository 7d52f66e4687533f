"""Sharded data parallelism against DDP: samples/s and peak memory per rank of each
`parallel.shard` level (none = DDP, optimizer = ZeRO-1, which runs as ZeRO-2, gradients = ZeRO-2,
full = ZeRO-3/FSDP) on 2 ranks, the same model and global batch, beside what the planner predicts
for each peak.

Each round is one sweep over the four levels, in an order turned by one every round (the machine
drifts); the figures are medians over rounds, the ratios each level's over DDP's of the same round.
The model is wide enough (a decoder of d_model 512, 4 blocks: 13.7 M parameters, 220 MB of weights,
gradients and AdamW's moments under DDP) for its state to outweigh its activations at this batch.
About 3 min on 2 cores. Usage: .venv/bin/python -m benchmarks.sharding [override ...]
"""

from __future__ import annotations

import sys
import tempfile
from statistics import median

from benchmarks.common import QUIET, ratio_line, runner, training_runs
from runner.metrics import PEAK_ALLOCATED, PEAK_MEMORY, THROUGHPUT, prediction

LEVELS = ["none", "optimizer", "gradients", "full"]
ROUNDS = 3
JOB = [
    "model=decoder", "model.d_model=512", "model.n_layers=4", "model.dropout=0",
    "data.batch_size=8", "trainer.max_steps=12", "trainer.warmup_steps=4",
    "parallel=fsdp", "hardware.devices=2", *QUIET,
]  # fmt: skip
FIGURES = {"samples/s": THROUGHPUT.name, "resident GiB": PEAK_MEMORY.name,
           "allocated GiB": PEAK_ALLOCATED.name,
           "planned GiB": prediction(PEAK_MEMORY.name)}  # fmt: skip


def one_round(folder: str, order: list[str], extra: list[str]) -> dict[str, dict[str, float]]:
    """One sweep over the levels in `order`; each level's figures."""
    runner("-m", *JOB, f"parallel.shard={','.join(order)}", *extra, cwd=folder)
    runs = training_runs(folder)[-len(order) :]
    return {
        r.data.params["parallel.shard"]: {k: r.data.metrics[m] for k, m in FIGURES.items()}
        for r in runs
    }


def main() -> None:
    extra = sys.argv[1:]
    with tempfile.TemporaryDirectory() as folder:
        done = [one_round(folder, LEVELS[r:] + LEVELS[:r], extra) for r in range(ROUNDS)]
    mid = {lv: {k: median(d[lv][k] for d in done) for k in FIGURES} for lv in LEVELS}
    ratios = {
        lv: {k: median(d[lv][k] / d["none"][k] for d in done) for k in FIGURES} for lv in LEVELS
    }
    print(f"{'shard':<10}" + "".join(f"{k:>15}" for k in FIGURES) + "   (and / DDP's)")
    for lv in LEVELS:
        cells = (f"{mid[lv][k]:>8.3f} {ratios[lv][k]:>5.2f}x" for k in FIGURES)
        print(f"{lv:<10}" + "".join(f"{c:>15}" for c in cells))
    for lv in LEVELS[1:]:
        print(ratio_line(f"samples/s, shard={lv} / DDP", ratios[lv]["samples/s"], "none"))
    for lv in LEVELS[1:]:
        name = f"peak allocated per rank, shard={lv} / DDP"
        print(
            ratio_line(
                name, ratios[lv]["allocated GiB"], f"< 1; planned {ratios[lv]['planned GiB']:.3f}"
            )
        )


if __name__ == "__main__":
    main()
