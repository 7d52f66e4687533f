"""Pipeline bubble on this machine: measured against (p - 1) / (m + p - 1), P = 2.

Runs a decoder with 4 blocks of d_model 256 and a global batch of 128 (enough work per
micro-batch that the schedule, not Python or P2P latency, dominates) with gpipe and 1f1b at M = 4
and 8, through the runner's CLI, and prints theory, measurement and their gap; the last line is the
worst gap. Extra overrides on the command line replace the job's.
Usage: .venv/bin/python benchmarks/pipeline_bubble.py [override ...]
"""

import subprocess
import sys
import tempfile
from pathlib import Path

from mlflow import MlflowClient

JOB = ["model=decoder", "model.dropout=0", "model.n_layers=4", "model.d_model=256"]
JOB += ["data.batch_size=128", "parallel=pipeline", "hardware.devices=2"]
QUIET = ["trainer.max_steps=25", "trainer.warmup_steps=5", "trainer.progress_bar=false"]


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        sweep = ["-m", "parallel.schedule=gpipe,1f1b", "parallel.microbatches=4,8"]
        done = subprocess.run(
            [sys.executable, "-m", "runner", *sweep, *JOB, *QUIET],
            cwd=tmp,
            capture_output=True,
            text=True,
        )
        if done.returncode:
            sys.exit(done.stderr[-3000:])
        client = MlflowClient(f"sqlite:///{Path(tmp) / 'mlflow.db'}")
        runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
        rows = []
        for r in runs:
            if r.data.tags.get("mode") != "train":
                continue
            m, p = r.data.metrics, r.data.params
            rows.append(
                (
                    p["parallel.schedule"],
                    int(p["parallel.microbatches"]),
                    m["bubble_fraction_theory"],
                    m["bubble_fraction_measured"],
                )
            )
    print(f"{'schedule':<10}{'M':>4}{'theory':>9}{'measured':>10}{'gap':>8}")
    for schedule, mb, theory, measured in sorted(rows):
        print(f"{schedule:<10}{mb:>4}{theory:>9.3f}{measured:>10.3f}{measured - theory:>+8.3f}")
    print(f"worst |measured - theory| = {max(abs(r[3] - r[2]) for r in rows):.3f} (target < 0.1)")


if __name__ == "__main__":
    main()
