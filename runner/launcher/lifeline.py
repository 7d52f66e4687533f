"""A job's processes end with the process that launched it, however it ends: SIGKILL included
(the OOM killer, a scheduler's hard kill after its grace period), which no handler sees.

Linux's PR_SET_PDEATHSIG has the kernel signal a process when its parent ends. The chain is the
launcher, the fork server it started (runner/launcher/fork_server.py), the ranks the server forks:
the server asks for SIGKILL when the launcher ends (this module, imported first by the server, does
it), each rank when the server ends (`die_with_parent` at the rank's start). Left alone, a killed
launcher's server and ranks trained on as orphans. Elsewhere than Linux nothing is done.

Ctrl-C, too, must reach every process: `listen_to_ctrl_c`.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
LAUNCHER_ENV = "RUNNER_LAUNCHER_PID"  # set by the launcher before it starts the fork server


def die_with_parent() -> None:
    """SIGKILL this process when its parent ends; now, if it ended before the request took."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)


def listen_to_ctrl_c() -> None:
    """A process started in the background by a non-interactive shell (a script, a batch job)
    inherits SIGINT ignored, so Python sets no KeyboardInterrupt: a rank then trained on through
    Ctrl-C until torch's launcher killed it 30 s later, and the launcher marked a run that had
    completed FAILED. The runner's processes take SIGINT as Python's default makes them."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


# Imported by the fork server (runner.launcher.fork_server.PRELOAD): the launcher's child. Imported
# anywhere else (a rank, a test) it does nothing.
if os.environ.get(LAUNCHER_ENV) == str(os.getppid()):
    die_with_parent()
