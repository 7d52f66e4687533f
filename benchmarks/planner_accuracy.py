"""How far to trust the planner here: calibrate this host, run a sweep of 8 layouts (dp, tp and
pp of 1 or 2: 1 to 8 processes), and compare each run's predicted step time with the measured one
(`mode=report`). Prints the report; its last line is the median absolute error of step time and
the Spearman rank correlation. Targets: error < 30 %, Spearman >= 0.8.
Usage: .venv/bin/python -m benchmarks.planner_accuracy [override ...]
"""

import sys
import tempfile

from benchmarks.common import runner

JOB = ["model=decoder", "model.dropout=0", "hardware=calibrated", "data.batch_size=32"]
QUIET = [
    "trainer.max_steps=20", "trainer.warmup_steps=5", "trainer.val_every_n_steps=1000",
    "trainer.progress_bar=false",
]  # fmt: skip
LAYOUTS = ["parallel.dp=1,2", "parallel.tp=1,2", "parallel.pp=1,2"]
PIPELINE = ["parallel.schedule=gpipe", "parallel.microbatches=4"]  # used where pp = 2


def main() -> None:
    extra = sys.argv[1:]
    with tempfile.TemporaryDirectory() as tmp:
        runner("mode=calibrate", *extra, cwd=tmp)
        runner("-m", *LAYOUTS, *PIPELINE, *JOB, *QUIET, *extra, cwd=tmp)
        report = runner("mode=report", cwd=tmp)
    print(report)
    figures = dict(line.split(": ") for line in report.splitlines() if ": " in line)
    print(
        f"median |error| of step time {float(figures['median_abs_error/step_time_s']):.1%} "
        f"(target < 30 %), Spearman {float(figures['spearman/step_time_s']):.2f} (target >= 0.8)"
    )


if __name__ == "__main__":
    main()
