"""The runner's own cost: its throughput against a hand-written PyTorch loop doing the same work
(benchmarks/plain_loop.py: same model, data, global batch, optimizer, threads), on one process and
with data parallelism on 2 (the loop under torchrun); and the cost of measuring: the runner with
its timing and counting (`trainer.measure`) on and off, on 2 processes, where the DDP hook runs.

This machine moves a whole run's throughput by 5-10 % from one process to the next (the same
program, run twice in a row), more than the effects measured here. So the sides run in rounds,
one run each, back to back, their order turned every round (drift over the minutes cancels), and
each figure is the median over rounds of that round's ratio; the rounds' spread is printed too.
Targets: runner / plain >= 0.95, measure on / off >= 0.97.
Usage: .venv/bin/python -m benchmarks.overhead [override ...]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from statistics import median

from benchmarks.common import last_metrics, ratio_line, runner

STEPS, WARMUP = 30, 5
# Rounds: one process costs a third of DDP's three runs and sits nearer its target, so more.
SINGLE_ROUNDS, DDP_ROUNDS = 7, 5
JOB = [f"trainer.max_steps={STEPS}", f"trainer.warmup_steps={WARMUP}", "trainer.val_batches=0"]
DP2 = ["parallel=data", "hardware.devices=2"]
TORCHRUN = ["torch.distributed.run", "--nnodes=1", "--nproc-per-node=2", "--rdzv-backend=c10d"]
TORCHRUN += ["--rdzv-endpoint=127.0.0.1:0", "--local-addr=127.0.0.1"]  # a free port, loopback


def runner_throughput(folder: str, *overrides: str) -> float:
    """samples/s the runner logged (its default progress bar on, as a user runs it), run in
    folder (one for all: its MLflow store is made once, as a user's is)."""
    runner(*JOB, *overrides, cwd=folder)
    return last_metrics(folder)["throughput_samples_per_s"]


def plain_throughput(world: int, *overrides: str) -> float:
    """samples/s of the hand-written loop; on 2 processes under torchrun, on 127.0.0.1 only."""
    launch = [sys.executable, "-m", *(TORCHRUN + ["-m"] if world > 1 else [])]
    done = subprocess.run(
        [*launch, "benchmarks.plain_loop", *JOB, *overrides],
        capture_output=True,
        text=True,
        env={**os.environ, "GLOO_SOCKET_IFNAME": "lo"},
    )
    if done.returncode:
        sys.exit(f"the plain loop failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])["throughput_samples_per_s"]


def rounds(count: int, **sides: Callable[[], float]) -> list[dict[str, float]]:
    """`count` rounds of one run of each side, the order turned by one every round."""
    names = list(sides)
    out = []
    for r in range(count):
        order = names[r % len(names) :] + names[: r % len(names)]
        out.append({name: sides[name]() for name in order})
    return out


def ratio(done: list[dict[str, float]], a: str, b: str) -> tuple[float, list[float]]:
    """The median over rounds of a / b, and every round's."""
    each = [r[a] / r[b] for r in done]
    return median(each), each


def show(label: str, figure: tuple[float, list[float]]) -> None:
    mid, each = figure
    print(f"{label:<28}{mid:>7.3f}   rounds: {' '.join(f'{x:.3f}' for x in each)}")


def main() -> None:
    extra = sys.argv[1:]
    with tempfile.TemporaryDirectory() as tmp:
        single = rounds(
            SINGLE_ROUNDS,
            runner=lambda: runner_throughput(tmp, *extra),
            plain=lambda: plain_throughput(1, *extra),
        )
        ddp = rounds(
            DDP_ROUNDS,
            runner=lambda: runner_throughput(tmp, *DP2, *extra),
            plain=lambda: plain_throughput(2, *extra),
            unmeasured=lambda: runner_throughput(tmp, *DP2, "trainer.measure=false", *extra),
        )
    figures = {
        "runner / plain, 1 process": ratio(single, "runner", "plain"),
        "runner / plain, DDP 2": ratio(ddp, "runner", "plain"),
        "measure on / off, DDP 2": ratio(ddp, "runner", "unmeasured"),
    }
    for label, done in (("1 process", single), ("DDP, 2 processes", ddp)):
        sides = "  ".join(f"{k} {median(r[k] for r in done):.1f}" for k in done[0])
        print(f"samples/s, {label} (median of {len(done)} rounds): {sides}")
    for label, figure in figures.items():
        show(label, figure)
    targets = [">= 0.95", ">= 0.95", ">= 0.97"]
    for (label, (mid, _)), target in zip(figures.items(), targets, strict=True):
        print(ratio_line(label, mid, target))


if __name__ == "__main__":
    main()
