"""Lightning's progress bar, redrawn at most four times a second.

Redrawn at every step it cost rank 0 a few milliseconds a step, which under DDP every other rank
waits for at the next all-reduce: a few per cent of a small model's step.
"""

import time

from runner.compat.lightning import progress_bar_base


class ProgressBar(progress_bar_base()):
    def __init__(self, every_s: float = 0.25) -> None:
        super().__init__()
        self.every_s, self.drawn = every_s, 0.0

    def _should_update(self, current: int, total: int) -> bool:
        if not super()._should_update(current, total):
            return False
        now = time.monotonic()
        if current != total and now - self.drawn < self.every_s:
            return False
        self.drawn = now
        return True
