"""How much this machine's speed drifts with nothing changed: the hand-written loop
(benchmarks/plain_loop.py, the default decoder) for STEPS steps in one process, its samples/s over
every window of WINDOW steps. Why benchmarks/overhead.py pairs its sides in rounds and judges
them at equal compute speed: a run of 30 steps (3-4 s) can land in a slow stretch or a fast one.
Not part of `make bench` (it compares nothing); 40 s here.
Usage: .venv/bin/python -m benchmarks.noise [override ...]
"""

from __future__ import annotations

import itertools
import sys

from benchmarks.common import ratio_line
from benchmarks.plain_loop import config, train

STEPS, WINDOW = 300, 10


def main() -> None:
    cfg = config([f"trainer.max_steps={STEPS}", *sys.argv[1:]])
    starts, _ = train(cfg)
    edges = starts[WINDOW::WINDOW]  # the first window holds the warm-up
    speeds = [WINDOW * cfg.data.batch_size / (b - a) for a, b in itertools.pairwise(edges)]
    print(f"samples/s every {WINDOW} steps: {' '.join(f'{s:.0f}' for s in speeds)}")
    print(ratio_line(f"fastest / slowest {WINDOW}-step window", max(speeds) / min(speeds), "none"))


if __name__ == "__main__":
    main()
