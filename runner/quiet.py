"""The terminal shows the runner's own lines and real warnings, not third parties' noise: Lightning
advertises a logging service and its hardware summary on every run, warns that `srun` exists on a
machine that has SLURM installed, and calls a torch API that torch deprecates (Lightning's
`_pytree`, not the user's code); MLflow says when it starts and stops sampling system metrics;
torch logs that torchao registers an enum the old way (trainer.precision=fp8) at its import.
Each is dropped by its exact text (MLflow's by its level); anything else still shows.
"""

from __future__ import annotations

import logging
import warnings

LIGHTNING_INFO = ("💡 Tip:", "GPU available:", "TPU available:", "HPU available:")
WARNINGS = (
    # The working folder's conf/ is on the search path (conf/config.yaml); most have none.
    r"provider=hydra.searchpath in main, path=conf is not available",
    r"The `srun` command is available on your system but is not used",
    r"`isinstance\(treespec, LeafSpec\)` is deprecated",
)


class DropLines(logging.Filter):
    def __init__(self, starts: tuple[str, ...]) -> None:
        super().__init__()
        self.starts = starts

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.starts)


LIGHTNING_FILTER = DropLines(LIGHTNING_INFO)  # one instance: a logger adds it once
PYTREE_FILTER = DropLines(("%s is an Enum subclass and is now natively supported",))


def quiet_third_parties() -> None:
    """In the launcher before Hydra composes, and in every rank before Lightning's Trainer (one
    process can be both: calling it again adds nothing)."""
    logging.getLogger("pytorch_lightning.utilities.rank_zero").addFilter(LIGHTNING_FILTER)
    # "Started monitoring system metrics." and its like, on every run: its warnings still show
    logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)
    logging.getLogger("torch.utils._pytree").addFilter(PYTREE_FILTER)
    for message in WARNINGS:
        warnings.filterwarnings("ignore", message=message)
