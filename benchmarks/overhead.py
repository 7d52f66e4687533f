"""The runner's own cost: its throughput against a hand-written PyTorch loop doing the same work
(benchmarks/plain_loop.py: same model, data, global batch, optimizer, threads), on one process and
with data parallelism on 2 (the loop under torchrun); and the cost of measuring: the runner with
its timing and counting (`trainer.measure`) on and off, on 2 processes, where the DDP hook runs.

Each side runs three times, the sides alternating, and keeps its best: on a shared 2-core machine
noise only ever slows a run down. Targets: runner / plain >= 0.95, measure on / off >= 0.97.
Usage: .venv/bin/python -m benchmarks.overhead [override ...]
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable

from benchmarks.common import last_metrics, ratio_line, runner

STEPS, WARMUP, REPEATS = 50, 10, 3
JOB = [f"trainer.max_steps={STEPS}", f"trainer.warmup_steps={WARMUP}", "trainer.val_batches=0"]
DP2 = ["parallel=data", "hardware.devices=2"]


def runner_throughput(*overrides: str) -> float:
    """samples/s the runner logged (its default progress bar on, as a user runs it)."""
    with tempfile.TemporaryDirectory() as tmp:
        runner(*JOB, *overrides, cwd=tmp)
        return last_metrics(tmp)["throughput_samples_per_s"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def plain_throughput(world: int, *overrides: str) -> float:
    """samples/s of the hand-written loop; on 2 processes under torchrun, on 127.0.0.1 only."""
    launch = [sys.executable, "-m"]
    if world > 1:
        launch += ["torch.distributed.run", "--nnodes=1", f"--nproc-per-node={world}",
                   "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}",
                   "--local-addr=127.0.0.1", "-m"]  # fmt: skip
    done = subprocess.run(
        [*launch, "benchmarks.plain_loop", *JOB, *overrides],
        capture_output=True,
        text=True,
        env={**os.environ, "GLOO_SOCKET_IFNAME": "lo"},
    )
    if done.returncode:
        sys.exit(f"the plain loop failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])["throughput_samples_per_s"]


def best_of(*sides: Callable[[], float]) -> list[float]:
    """Each side's best of REPEATS runs, the sides alternating."""
    runs = [[side() for side in sides] for _ in range(REPEATS)]
    return [max(column) for column in zip(*runs, strict=True)]


def main() -> None:
    extra = sys.argv[1:]
    single, plain_single = best_of(
        lambda: runner_throughput(*extra), lambda: plain_throughput(1, *extra)
    )
    on, plain_ddp, off = best_of(
        lambda: runner_throughput(*DP2, *extra),
        lambda: plain_throughput(2, *extra),
        lambda: runner_throughput(*DP2, "trainer.measure=false", *extra),
    )
    print(f"{'samples/s':<20}{'runner':>10}{'plain':>10}{'ratio':>8}")
    print(f"{'1 process':<20}{single:>10.1f}{plain_single:>10.1f}{single / plain_single:>8.3f}")
    print(f"{'DDP, 2 processes':<20}{on:>10.1f}{plain_ddp:>10.1f}{on / plain_ddp:>8.3f}")
    print(f"{'DDP, measure off':<20}{off:>10.1f}{plain_ddp:>10.1f}{off / plain_ddp:>8.3f}")
    print(ratio_line("runner / plain, 1 process", single / plain_single, ">= 0.95"))
    print(ratio_line("runner / plain, DDP 2", on / plain_ddp, ">= 0.95"))
    print(ratio_line("measure on / off, DDP 2", on / off, ">= 0.97"))


if __name__ == "__main__":
    main()
