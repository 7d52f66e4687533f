"""The server a launcher's ranks fork from (multiprocessing's fork server): it imports what every
rank imports once (runner/training/preload.py: torch, Lightning, MLflow's store, the models, the
data sets' readers), where each rank would import it again, and lives on across a sweep's jobs.
Started as early as the launcher knows it will launch, its seconds of imports overlap the
launcher's own. Nothing of the launcher (its MLflow connection, its threads) is forked: the server
starts clean. This module imports nothing heavy, so that starting the server comes first.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
import os

from runner.launcher import preemption
from runner.launcher.lifeline import LAUNCHER_ENV

# The server's imports: itself first (it ends with this process: runner/launcher/lifeline.py), then
# all a rank would import.
PRELOAD = ["runner.launcher.lifeline", "runner.training.preload"]


def start_fork_server() -> None:
    """Start the server if it is not running: at once, its imports in the background (the first
    fork waits for them)."""
    os.environ[LAUNCHER_ENV] = str(os.getpid())
    preemption.ignore()  # the ranks' signal; the server and the tracker inherit the ignoring
    multiprocessing.set_forkserver_preload(PRELOAD)
    multiprocessing.forkserver.ensure_running()
