"""What recomputing activations costs in time: the `recompute` study as shipped (the default
decoder with 4 layers, a batch of 64: none, selective, full), each job's step time against
none's, measured and planned.

Full recomputation runs every block's forward again during backward: about one more forward pass,
a third more compute (Korthikanti et al. 2022). The suite's test holds the study's memory and its
losses; its step times it cannot hold beside another test's load (one timed step measured "none"
at 1.8 s and "full" at 1.2 s once), so they are held here, on a quiet host. The last line: full's
step over none's (target >= 1.15: full costs time, about a third more).
Usage: .venv/bin/python -m benchmarks.recompute_time [override ...]
"""

from __future__ import annotations

import sys
import tempfile

from benchmarks.common import QUIET, ratio_line, runner, training_runs
from runner.metrics import STEP_TIME, prediction


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        runner("-m", "+experiment=recompute", *QUIET, *sys.argv[1:], cwd=tmp)
        runs = training_runs(tmp)
    steps = {
        r.data.params["trainer.recompute"]: (
            r.data.metrics[STEP_TIME.name],
            r.data.metrics[prediction(STEP_TIME.name)],
        )
        for r in runs
    }
    none, planned_none = steps["none"]
    print(f"{'recompute':<10}{'step ms':>9}{'/ none':>8}{'planned ms':>12}{'/ none':>8}")
    for mode, (step, planned) in steps.items():
        print(f"{mode:<10}{1e3 * step:>9.1f}{step / none:>8.2f}{1e3 * planned:>12.1f}"
              f"{planned / planned_none:>8.2f}")  # fmt: skip
    print(ratio_line("recompute: full's step over none's", steps["full"][0] / none, ">= 1.15"))


if __name__ == "__main__":
    main()
