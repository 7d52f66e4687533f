"""Start-up: what a command costs beyond its work.

- `python -m runner --cfg job` (compose and print the config): target < 2 s wall.
- `python -m runner mode=plan model=gpt3_175b` on 16 nodes of 8 H100 (on this host's own profile
  GPT-3 is refused at once: not one layer fits in its memory), with its MLflow store made (the
  first run in a folder also creates the store's tables; printed apart): target < 6 s wall.
- The same plan's answer: the time until its table's "bound by" row is printed (the record in
  MLflow comes after it): target < 2 s.
- `mode=search` of GPT-3's layouts: the time until it prints that it is searching: target < 2 s.
- A plan sweep of 20 GPT-3 layouts (tp 1-8 x pp 1-16): layouts a minute, from the sweep's wall
  less one plan's: target > 200.
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
from runner.metrics import THROUGHPUT

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


PLAN_SWEEP = ["-m", *PLAN[:4], "parallel.tp=1,2,4,8", "parallel.pp=1,2,4,8,16"]
PLAN_SWEEP += ["data.batch_size=1024", "parallel.microbatches=${parallel.pp}"]
LAYOUTS = 4 * 5
ANSWERED = "bound by"  # the table's row after the step time: the plan is answered
SEARCH = ["mode=search", *PLAN[1:3], "data.batch_size=1024", "search.nodes=[4]"]
SEARCHING = "searching"  # mode=search's first line: its layouts counted, their pricing begins


def best_wall(*args: str, cwd: str) -> float:
    return min(timed_runner(*args, cwd=cwd) for _ in range(REPEATS))


def answer_s(*args: str, cwd: str, marker: str = ANSWERED) -> float:
    """Seconds until `python -m runner ARGS` prints the line that holds `marker`."""
    start, seconds = time.perf_counter(), float("inf")
    with subprocess.Popen(
        [sys.executable, "-m", "runner", *args], cwd=cwd, stdout=subprocess.PIPE, text=True
    ) as job:
        for line in job.stdout:
            if marker in line and seconds == float("inf"):
                seconds = time.perf_counter() - start
        job.wait(timeout=RUN_LIMIT_S)
    return seconds


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
        SWEEP_STEPS * int(r.data.params["data.batch_size"]) / r.data.metrics[THROUGHPUT.name]
        for r in training_runs(tmp)
    )
    return wall, steps, interpreter_startup()


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cfg_job = best_wall("--cfg", "job", cwd=tmp)
        first_plan = timed_runner(*PLAN, cwd=tmp)
        plan = best_wall(*PLAN, cwd=tmp)
        answer = min(answer_s(*PLAN, cwd=tmp) for _ in range(REPEATS))
        per_minute = LAYOUTS * 60 / (best_wall(*PLAN_SWEEP, cwd=tmp) - plan)
        searching = min(answer_s(*SEARCH, cwd=tmp, marker=SEARCHING) for _ in range(REPEATS))
    with tempfile.TemporaryDirectory() as tmp:
        wall, steps, startup = sweep_ratio(tmp)
    base = steps + PROCESSES * startup
    print(f"--cfg job                     {cfg_job:6.2f} s")
    print(f"mode=plan model=gpt3_175b     {plan:6.2f} s (first in a folder: {first_plan:.2f} s)")
    print(f"2-job sweep of 2 processes    {wall:6.2f} s: training steps {steps:.2f} s + "
          f"{PROCESSES} x start-up {startup:.2f} s = {base:.2f} s")  # fmt: skip
    print(f"its answer printed after      {answer:6.2f} s")
    print(f"a plan sweep of {LAYOUTS} layouts   {per_minute:6.0f} layouts a minute")
    print(f"mode=search starts searching  {searching:6.2f} s")
    print(ratio_line("--cfg job, seconds", cfg_job, "< 2"))
    print(ratio_line("mode=plan model=gpt3_175b, seconds", plan, "< 6"))
    print(ratio_line("mode=plan's answer, seconds", answer, "< 2"))
    print(ratio_line("planned layouts a minute", per_minute, "> 200"))
    print(ratio_line("mode=search starts searching, seconds", searching, "< 2"))
    print(ratio_line("sweep / (steps + start-ups)", wall / base, "< 1.5"))


if __name__ == "__main__":
    main()
