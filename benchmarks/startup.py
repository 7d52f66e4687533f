"""Start-up: what a command costs beyond its work.

- `python -m runner --cfg job` (compose and print the config): target < 2 s wall.
- `python -m runner mode=plan model=gpt3_175b` on 16 nodes of 8 H100 (on this host's own profile
  GPT-3 is refused at once: not one layer fits in its memory), with its MLflow store made (the
  first run in a folder also creates the store's tables; printed apart): target < 6 s wall.
- A 2-job sweep of 2-process jobs against the time of its training steps (steps x the mean loop
  interval each job logged) plus one interpreter start-up per process (the launcher and 4 ranks;
  a start-up = Python importing torch and Lightning, measured here): target < 1.5.

Walls are the best of 3 (noise only slows a command down). Usage: .venv/bin/python -m
benchmarks.startup
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time

from benchmarks.common import QUIET, RUN_LIMIT_S, ratio_line, timed_runner, training_runs

REPEATS = 3
SWEEP_STEPS = 60
SWEEP = [
    "-m",
    "seed=1,2",
    "parallel=data",
    "hardware.devices=2",
    f"trainer.max_steps={SWEEP_STEPS}",
]
PROCESSES = 1 + 2 * 2  # the launcher, and 2 ranks per job
PLAN = ["mode=plan", "model=gpt3_175b", "hardware=h100_cluster", "parallel.dp=null"]
PLAN += ["parallel.tp=8", "parallel.pp=8", "parallel.microbatches=64", "data.batch_size=1024"]


def best_wall(*args: str, cwd: str) -> float:
    return min(timed_runner(*args, cwd=cwd) for _ in range(REPEATS))


def interpreter_startup() -> float:
    def once() -> float:
        start = time.perf_counter()
        imports = [sys.executable, "-c", "import torch, pytorch_lightning"]
        subprocess.run(imports, check=True, timeout=RUN_LIMIT_S)
        return time.perf_counter() - start

    return min(once() for _ in range(REPEATS))


def sweep_ratio(tmp: str) -> tuple[float, float, float]:
    """(sweep wall, its training steps' time, one start-up)."""
    wall = timed_runner(*SWEEP, *QUIET, cwd=tmp)
    steps = sum(
        SWEEP_STEPS
        * int(r.data.params["data.batch_size"])
        / r.data.metrics["throughput_samples_per_s"]
        for r in training_runs(tmp)
    )
    return wall, steps, interpreter_startup()


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cfg_job = best_wall("--cfg", "job", cwd=tmp)
        first_plan = timed_runner(*PLAN, cwd=tmp)
        plan = best_wall(*PLAN, cwd=tmp)
    with tempfile.TemporaryDirectory() as tmp:
        wall, steps, startup = sweep_ratio(tmp)
    base = steps + PROCESSES * startup
    print(f"--cfg job                     {cfg_job:6.2f} s")
    print(f"mode=plan model=gpt3_175b     {plan:6.2f} s (first in a folder: {first_plan:.2f} s)")
    print(f"2-job sweep of 2 processes    {wall:6.2f} s: training steps {steps:.2f} s + "
          f"{PROCESSES} x start-up {startup:.2f} s = {base:.2f} s")  # fmt: skip
    print(ratio_line("--cfg job, seconds", cfg_job, "< 2"))
    print(ratio_line("mode=plan model=gpt3_175b, seconds", plan, "< 6"))
    print(ratio_line("sweep / (steps + start-ups)", wall / base, "< 1.5"))


if __name__ == "__main__":
    main()
