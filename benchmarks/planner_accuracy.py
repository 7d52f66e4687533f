"""How far to trust the planner here: calibrate this host at the threads each rank of the sweep
gets (1: 2 or more processes on 2 cores), run a sweep of 8 layouts (dp, tp and pp of 1 or 2: 1 to
8 processes; a pipeline runs one micro-batch per stage), and compare each run's predicted step
time with the measured one (`mode=report`). Prints the report; its last lines are the median
absolute error of step time and the Spearman rank correlation. Targets: error <= 15 %, Spearman
>= 0.9.
Usage: .venv/bin/python -m benchmarks.planner_accuracy [override ...]
"""

import sys
import tempfile

from benchmarks.common import ratio_line, runner
from runner.metrics import REPORT_ERROR, REPORT_SPEARMAN, STEP_TIME

JOB = ["model=decoder", "model.dropout=0", "hardware=calibrated", "data.batch_size=32"]
QUIET = [
    "trainer.max_steps=20", "trainer.warmup_steps=5", "trainer.val_every_n_steps=1000",
    "trainer.progress_bar=false",
]  # fmt: skip
LAYOUTS = ["parallel.dp=1,2", "parallel.tp=1,2", "parallel.pp=1,2"]
PIPELINE = ["parallel.schedule=gpipe", "parallel.microbatches=${parallel.pp}"]
CALIBRATE = ["mode=calibrate", "hardware.threads_per_rank=1"]


def main() -> None:
    extra = sys.argv[1:]
    with tempfile.TemporaryDirectory() as tmp:
        runner(*CALIBRATE, *extra, cwd=tmp)
        runner("-m", *LAYOUTS, *PIPELINE, *JOB, *QUIET, *extra, cwd=tmp)
        report = runner("mode=report", cwd=tmp)
    print(report)
    figures = dict(line.split(": ") for line in report.splitlines() if ": " in line)
    error, rank = (
        float(figures[m.at(figure=STEP_TIME.name)]) for m in (REPORT_ERROR, REPORT_SPEARMAN)
    )
    print(ratio_line("median |error| of step time", error, "<= 0.15"))
    print(ratio_line("Spearman of step time", rank, ">= 0.9"))


if __name__ == "__main__":
    main()
