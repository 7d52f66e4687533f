"""16-bit weights and float8 against fp32 over a real run: the default decoder, 300 steps, in
32-true, bf16-true (bf16 weights over fp32 masters) and fp8 (bf16-true with float8 linear layers,
tensorwise scaling), the same data and initial weights. Prints each curve at a few steps and the
largest step-by-step relative difference: bf16-true against 32-true (target: within 2 %), fp8
against bf16-true (target: within 3 %). Losses, not times: a noisy host changes nothing here, but
the three runs take about 2.5 min on 2 cores, more than the suite can spend; on a CPU without bf16
instructions (the 2-core AVX2 EPYC) 16-bit products are tens of times slower and the runs take
about 20 min. So each precision runs on its own, its time limit sized by a probe of PROBE_STEPS
steps of it on this host, never by one host's guess (a fixed 600 s stopped bf16-true there).
The same seed gives each run the same data and initial weights.
Usage: .venv/bin/python -m benchmarks.precision_curves [override ...]
"""

from __future__ import annotations

import sys
import tempfile
import time

from mlflow import MlflowClient

from benchmarks.common import QUIET, RUN_LIMIT_S, ratio_line, runner, training_runs
from runner.metrics import TRAIN_LOSS

STEPS = 300
PRECISIONS = ("32-true", "bf16-true", "fp8")
PROBE_STEPS = 10
# A run's limit: its probe's time a step for every step, twice over (the start-up is in the
# probe's steps, and the host's speed drifts by 5-15 %), and never under common.RUN_LIMIT_S.
MARGIN = 2
SHOWN = (0, 49, 99, 199, 299)


def curves(cwd: str) -> dict[str, list[float]]:
    client = MlflowClient(f"sqlite:///{cwd}/mlflow.db")
    out = {}
    for run in training_runs(cwd):
        history = client.get_metric_history(run.info.run_id, TRAIN_LOSS.name)
        ordered = sorted(history, key=lambda m: m.step)
        out[run.data.params["trainer.precision"]] = [m.value for m in ordered]
    return out


def worst(a: list[float], b: list[float]) -> float:
    """The largest |a - b| / b over the steps both logged."""
    return max(abs(x - y) / y for x, y in zip(a, b, strict=True))


def train(precision: str, steps: int, cwd: str, timeout_s: float = RUN_LIMIT_S) -> None:
    runner(f"trainer.max_steps={steps}", f"trainer.precision={precision}", *QUIET, *sys.argv[1:],
           cwd=cwd, timeout_s=timeout_s)  # fmt: skip


def limit_s(precision: str) -> float:
    """How long STEPS steps of `precision` may take here: a probe of PROBE_STEPS steps, timed."""
    with tempfile.TemporaryDirectory() as probe:
        start = time.perf_counter()
        train(precision, PROBE_STEPS, probe)
        a_step = (time.perf_counter() - start) / PROBE_STEPS
    return max(RUN_LIMIT_S, MARGIN * a_step * STEPS)


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for precision in PRECISIONS:
            limit = limit_s(precision)
            print(f"{precision}: {STEPS} steps, limit {limit / 60:.1f} min", flush=True)
            train(precision, STEPS, tmp, timeout_s=limit)
        found = curves(tmp)
    print(f"{'step':>6}" + "".join(f"{name:>12}" for name in found))
    for step in SHOWN:
        print(f"{step + 1:>6}" + "".join(f"{c[step]:>12.4f}" for c in found.values()))
    bf16 = worst(found["bf16-true"], found["32-true"])
    print(ratio_line("bf16-true against 32-true, largest step's |difference|", bf16, "<= 0.02"))
    fp8 = worst(found["fp8"], found["bf16-true"])
    print(ratio_line("fp8 against bf16-true, largest step's |difference|", fp8, "<= 0.03"))


if __name__ == "__main__":
    main()
