"""`python -m runner ARGS` run by the test's own process: the command line's entry point
(runner.cli.main), its exit code and its output, without the seconds a new process spends
importing torch, Lightning, MLflow and Hydra. A job of several processes forks its ranks from the
runner's fork server (runner/launcher/launch.py), which the first such job starts and every later
one reuses: its imports, too, are paid once a session.

What a run leaves in a process is put back after each call: Hydra's global state, the logging
handlers Hydra's job logging bound to this call's output, the environment, the working folder and
the signal handlers. Only a test about the process itself (its signals, its exit, what it leaves
behind) starts one (tests/helpers/processes.py).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import signal
import subprocess
import sys
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# Not the job's: a test's store (the `store` fixture) reaches a job through its command line, as
# a user's would; Hydra's full traces are the command line's own choice (runner/cli.py).
UNSET = ("MLFLOW_TRACKING_URI", "HYDRA_FULL_ERROR")
# The `cli` fixture (tests/conftest.py): cli(*args, cwd=folder) -> a finished process's record
Cli = Callable[..., subprocess.CompletedProcess]
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP, signal.SIGQUIT)


def logging_handlers() -> dict[logging.Logger, list[logging.Handler]]:
    loggers = [logging.getLogger(name) for name in list(logging.Logger.manager.loggerDict)]
    return {log: log.handlers[:] for log in [logging.getLogger(), *loggers]}


@contextlib.contextmanager
def process_state_kept(cwd: Path, argv: list[str]) -> Iterator[None]:
    """The call's working folder and argv; afterwards this process as it was."""
    from hydra.core.global_hydra import GlobalHydra

    here, environ, saved_argv = os.getcwd(), dict(os.environ), sys.argv
    handlers = logging_handlers()
    signals = {sig: signal.getsignal(sig) for sig in SIGNALS}
    for key in UNSET:
        os.environ.pop(key, None)
    os.chdir(cwd)
    sys.argv = argv
    try:
        yield
    finally:
        sys.argv = saved_argv
        os.chdir(here)
        os.environ.clear()
        os.environ.update(environ)
        GlobalHydra.instance().clear()
        # Hydra's job logging binds handlers to this call's captured output, closed once the test
        # ends: a later test logging through them prints "I/O operation on closed file".
        for log in logging_handlers():
            log.handlers[:] = handlers.get(log, [])
        for sig, handler in signals.items():
            signal.signal(sig, handler)


def exit_code(stop: SystemExit) -> int:
    """A process's exit status for sys.exit(code): a message goes to stderr and gives 1."""
    if isinstance(stop.code, str):
        print(stop.code, file=sys.stderr)
        return 1
    return stop.code or 0


def call_main(*args: str, cwd: Path) -> int:
    """runner.cli.main with these arguments in cwd: the exit status a process would end with."""
    from runner.cli import main

    with process_state_kept(cwd, ["runner", *args]):
        try:
            main()
            return 0
        except SystemExit as stop:
            return exit_code(stop)
        except Exception:  # as the interpreter ends a process on an uncaught error
            traceback.print_exc()
            return 1


def run_in_process(capfd: Any, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`python -m runner ARGS` in cwd: what the command would exit with and print."""
    capfd.readouterr()  # what came before is not this command's
    code = call_main(*args, cwd=cwd)
    out, err = capfd.readouterr()
    return subprocess.CompletedProcess(["python", "-m", "runner", *args], code, out, err)


def main() -> None:
    """`python -m tests.helpers.in_process FOLDER COMMANDS`: the runner's commands (a JSON list
    of argument lists) in one new interpreter, one after another in FOLDER, for a runner other
    than this one (a copy of the repository first on PYTHONPATH): each one's exit status and
    output, a JSON object a line."""
    folder, commands = Path(sys.argv[1]), json.loads(sys.argv[2])
    for args in commands:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = call_main(*args, cwd=folder)
        print(json.dumps({"args": args, "returncode": code, "stderr": err.getvalue()}), flush=True)


if __name__ == "__main__":
    main()
