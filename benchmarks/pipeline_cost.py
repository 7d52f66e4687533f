"""The cost of a micro-batch in the runner's pipeline against the same schedule without the runner.

The `bubble` study's job (experiments/bubble.yaml, GPipe, a batch of 1,024) with a quarter of its
layers (2 stages of four 1,024-wide layers: what a micro-batch costs besides its work shows more
against 10 ms forwards than against the study's 40) at m = 2 and 8 micro-batches, four ways
(benchmarks/plain_pipeline.py has the plain two): a hand-written send/recv loop;
torch.distributed.pipelining's schedule alone; the runner with its timing and probes off
(`trainer.measure=false`); the runner as shipped. Each step's time is the loop's interval (batch
start to batch start, the optimizer included), the mean after the warm-up. The same global batch at
both m, so the same work: (step at m = 8 - step at m = 2) / 6 is what one more micro-batch costs
each way. The plain sides time their actions too (forward, backward, blocked receiving, summed over
a step, per rank).
The last line: the runner's step over the schedule's alone at m = 8 (target <= 1.10: what the runner
adds to torch's schedule). The schedule and the runner's sides run in ROUNDS rounds, their order
turned every round (docs/benchmarks.md's method): steps are medians, the ratio the rounds' median.
Usage: .venv/bin/python -m benchmarks.pipeline_cost [override ...]
"""

from __future__ import annotations

import json
import sys
import tempfile
from statistics import median

from benchmarks.common import QUIET, bounded, last_metrics, ratio_line, runner
from benchmarks.plain_pipeline import PREFIX
from runner.metrics import THROUGHPUT

BATCH = 1024
HIDDEN = "model.hidden=[" + ",".join(["1024"] * 7) + "]"  # four layers a stage
JOB = ["+experiment=bubble", HIDDEN, "parallel.schedule=gpipe", "trainer.max_steps=14"]
JOB += ["trainer.warmup_steps=4", *QUIET]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2"]
TORCHRUN += ["--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:0", "--local-addr=127.0.0.1"]
MICROBATCHES = (2, 8)
ROUNDS = 3


def plain(how: str, m: int, extra: list[str]) -> dict[str, float]:
    """Rank 0's and rank 1's figures, the step their mean: the plain pipeline's line."""
    job = ["model=ffnn", HIDDEN, f"data.batch_size={BATCH}", "parallel.schedule=gpipe"]
    job += [f"parallel.microbatches={m}", "trainer.max_steps=14", "trainer.warmup_steps=4"]
    done = bounded([*TORCHRUN, "-m", "benchmarks.plain_pipeline", how, *job, *extra], 600)
    line = next((x for x in done.stdout.splitlines() if x.startswith(PREFIX)), None)
    if done.returncode or line is None:
        sys.exit(f"benchmarks.plain_pipeline {how} failed:\n{done.stderr[-3000:]}")
    ranks = json.loads(line[len(PREFIX) :])
    return {k: sum(r.get(k, 0.0) for r in ranks) / len(ranks) for k in ranks[0]}


def runner_step(m: int, measure: bool, extra: list[str]) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        args = [*JOB, f"parallel.microbatches={m}", f"trainer.measure={str(measure).lower()}"]
        runner(*args, *extra, cwd=tmp)
        return BATCH / last_metrics(tmp)[THROUGHPUT.name]


def main() -> None:
    extra = sys.argv[1:]
    actions = {"loop": {m: plain("loop", m, extra) for m in MICROBATCHES}, "schedule": {}}

    def schedule(m: int) -> float:
        actions["schedule"][m] = plain("schedule", m, extra)  # the last round's
        return actions["schedule"][m]["step_s"]

    sides = {
        "schedule": schedule,
        "runner, measure=false": lambda m: runner_step(m, False, extra),
        "runner": lambda m: runner_step(m, True, extra),
    }
    names, runs = list(sides), {name: {m: [] for m in MICROBATCHES} for name in sides}
    for r in range(ROUNDS):  # one run of each side at each m a round, the order turned by one
        for m in MICROBATCHES:
            for name in names[r % 3 :] + names[: r % 3]:
                runs[name][m].append(sides[name](m))
    steps = {"loop": {m: a["step_s"] for m, a in actions["loop"].items()}}
    steps |= {name: {m: median(x) for m, x in by_m.items()} for name, by_m in runs.items()}
    print(f"{'':<24}{'step m=2':>10}{'step m=8':>10}{'a micro-batch':>15}   (ms)")
    for name, at in steps.items():
        each = (at[8] - at[2]) / 6
        print(f"{name:<24}{1e3 * at[2]:>10.1f}{1e3 * at[8]:>10.1f}{1e3 * each:>15.2f}")
    print("\nper rank and step, summed (ms): forward, backward, blocked receiving")
    for how, by_m in actions.items():
        for m, a in by_m.items():
            parts = (a.get(k, 0.0) * 1e3 for k in ("forward_s", "backward_s", "wait_s"))
            print(f"{how:<10} m={m}  " + "  ".join(f"{p:8.1f}" for p in parts))
    for m, other in ((2, "runner, measure=false"), (8, "runner, measure=false"), (8, "schedule")):
        each = [a / b for a, b in zip(runs["runner"][m], runs[other][m], strict=True)]
        print(f"m={m}: runner / {other}, rounds: " + " ".join(f"{x:.3f}" for x in each))
    ratio = median(each)  # the last: over the schedule's, m = 8
    print(ratio_line("pipeline m=8: runner / torch's schedule alone, step time", ratio, "<= 1.10"))


if __name__ == "__main__":
    main()
