"""What keeping freed memory (runner/launcher/allocator.py, which every rank of the runner does) is
worth: the hand-written loop (benchmarks/plain_loop.py, the default decoder, one process) with
glibc's default malloc and with the runner's setting, in rounds as benchmarks/overhead.py runs its
sides. Prints samples/s, minor page faults a step and peak resident memory of each, and their
ratios. Not part of `make bench` (the runner's figures there already include it); 2 min here.
Usage: .venv/bin/python -m benchmarks.allocator [override ...]
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from statistics import median

from benchmarks.common import ratio_line
from benchmarks.overhead import JOB, Measured, ratio, rounds, show
from benchmarks.plain_loop import config, samples_per_s, train
from runner.launcher.allocator import keep_freed_memory

ROUNDS = 6


def one_run(kept: bool, overrides: list[str]) -> None:
    """In a fresh process: train, and print the figures as JSON."""
    if kept and not keep_freed_memory():
        sys.exit("benchmarks.allocator: glibc's malloc only")
    cfg = config([*JOB, *overrides])
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    starts, _ = train(cfg)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    out = {
        "samples/s": samples_per_s(cfg, starts),
        "faults/step": faults / cfg.trainer.max_steps,
        "peak MiB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    print(json.dumps(out))


def side(kept: bool, overrides: list[str]) -> Measured:
    args = [sys.executable, "-m", "benchmarks.allocator", "--run", str(int(kept)), *overrides]
    done = subprocess.run(args, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    if sys.argv[1:2] == ["--run"]:
        one_run(sys.argv[2] == "1", sys.argv[3:])
        return
    extra = sys.argv[1:]
    done = rounds(ROUNDS, kept=lambda: side(True, extra), default=lambda: side(False, extra))
    for key in ("faults/step", "peak MiB"):
        print(f"{key}: " + "  ".join(f"{k} {median(r[k][key] for r in done):.0f}" for k in done[0]))
    figures = {key: ratio(done, "kept", "default", key) for key in ("samples/s", "peak MiB")}
    for key, figure in figures.items():
        show(f"{key}, kept / glibc default", figure)
    for key, (mid, _) in figures.items():
        print(ratio_line(f"{key}, freed memory kept / glibc default", mid, "none"))


if __name__ == "__main__":
    main()
