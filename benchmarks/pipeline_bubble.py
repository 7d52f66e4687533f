"""Pipeline efficiency on this machine, P = 2: the measured bubble against (p - 1) / (m + p - 1),
and the samples/s of the pipeline at M = 8 against one process at the same global batch.

The theory assumes stages of equal cost. The decoder's last stage also holds the output layer
(vocabulary 2,048 x d_model 256: about 2/3 of a block's work), so 4 blocks split [2, 2] leave the
first stage waiting a quarter of every micro-batch (measured gap 0.07-0.10, most of it that);
5 blocks split [3, 2] balance them (3 blocks against 2 2/3). A global batch of 96 (12 samples a
micro-batch at M = 8) gives each action enough work that the schedule, not Python or P2P latency,
dominates. Runs gpipe and 1f1b at M = 4 and 8, and the same job on one process with both cores.
On 2 cores the pipeline cannot be faster: its stages share the cores one process uses, and it adds
the bubble and the P2P sends. The last line is the worst bubble gap; the line before it, pipeline
(1f1b, M = 8) / one process in samples/s.
Usage: .venv/bin/python -m benchmarks.pipeline_bubble [override ...]
"""

import sys
import tempfile

from benchmarks.common import QUIET, ratio_line, runner, training_runs
from runner.metrics import BUBBLE_MEASURED, BUBBLE_THEORY, THROUGHPUT

JOB = ["model=decoder", "model.dropout=0", "model.n_layers=5", "model.d_model=256"]
JOB += ["data.batch_size=96", "trainer.max_steps=10", "trainer.warmup_steps=3", *QUIET]
PIPELINE = ["parallel=pipeline", "hardware.devices=2", "parallel.split=[3,2]"]


def main() -> None:
    extra = sys.argv[1:]
    with tempfile.TemporaryDirectory() as tmp:
        sweep = ["-m", "parallel.schedule=gpipe,1f1b", "parallel.microbatches=4,8"]
        runner(*sweep, *JOB, *PIPELINE, *extra, cwd=tmp)
        runner(*JOB, *extra, cwd=tmp)
        runs = training_runs(tmp)
    single = next(r for r in runs if r.data.tags["parallel"] == "none").data.metrics
    rows = {
        (r.data.params["parallel.schedule"], int(r.data.params["parallel.microbatches"])): (
            r.data.metrics
        )
        for r in runs
        if r.data.tags["parallel"] == "pipeline"
    }
    print(f"{'schedule':<10}{'M':>4}{'theory':>9}{'measured':>10}{'gap':>8}{'samples/s':>11}")
    for (schedule, mb), m in sorted(rows.items()):
        theory, measured = m[BUBBLE_THEORY.name], m[BUBBLE_MEASURED.name]
        print(
            f"{schedule:<10}{mb:>4}{theory:>9.3f}{measured:>10.3f}{measured - theory:>+8.3f}"
            f"{m[THROUGHPUT.name]:>11.1f}"
        )
    print(f"{'none':<10}{'':>4}{'':>9}{'':>10}{'':>8}{single[THROUGHPUT.name]:>11.1f}")
    best = rows[("1f1b", 8)][THROUGHPUT.name] / single[THROUGHPUT.name]
    worst = max(abs(m[BUBBLE_MEASURED.name] - m[BUBBLE_THEORY.name]) for m in rows.values())
    print(ratio_line("pipeline 1f1b M=8 / one process, samples/s", best, "none"))
    print(ratio_line("worst bubble gap, measured - theory", worst, "< 0.1"))


if __name__ == "__main__":
    main()
