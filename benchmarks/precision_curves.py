"""16-bit weights and float8 against fp32 over a real run: the default decoder, 300 steps, in
32-true, bf16-true (bf16 weights over fp32 masters) and fp8 (bf16-true with float8 linear layers,
tensorwise scaling), the same data and initial weights. Prints each curve at a few steps and the
largest step-by-step relative difference: bf16-true against 32-true (target: within 2 %), fp8
against bf16-true (target: within 3 %). Losses, not times: a noisy host changes nothing here, but
the three runs take about 2.5 min on 2 cores, more than the suite can spend.
Usage: .venv/bin/python -m benchmarks.precision_curves [override ...]
"""

from __future__ import annotations

import sys
import tempfile

from mlflow import MlflowClient

from benchmarks.common import QUIET, ratio_line, runner, training_runs
from runner.metrics import TRAIN_LOSS

STEPS = 300
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


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        runner("-m", f"trainer.max_steps={STEPS}", "trainer.precision=32-true,bf16-true,fp8",
               *QUIET, *sys.argv[1:], cwd=tmp)  # fmt: skip
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
