"""What every benchmark shares: the runner's CLI in a scratch folder, its runs, and the machine."""

from __future__ import annotations

import contextlib
import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from statistics import median
from typing import Any

from mlflow import MlflowClient

# Quiet jobs: no progress bar in a pipe, no validation (the hand-written loops have none either).
QUIET = ["trainer.progress_bar=false", "trainer.val_batches=0"]


def bounded(
    command: list[str], timeout_s: float | None, **popen: Any
) -> subprocess.CompletedProcess[str]:
    """subprocess.run(command, capture_output=True, text=True), but a command still running after
    timeout_s ends the benchmark with a clear message rather than holding it. The command runs in
    a session of its own, so that all it started can be stopped together: its process group gets
    SIGTERM on a timeout, SIGINT on Ctrl-C (the runner and torchrun then stop their ranks), and
    SIGKILL if still there 30 s later."""
    with subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        **popen,
    ) as process:
        try:
            out, err = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _, err = stop(process, signal.SIGTERM)
            sys.exit(f"{' '.join(command)} still ran after {timeout_s:.0f} s:\n{err[-3000:]}")
        except BaseException:  # Ctrl-C: its own session no longer gets it from the terminal
            stop(process, signal.SIGINT)
            raise
    return subprocess.CompletedProcess(command, process.returncode, out, err)


def stop(process: subprocess.Popen[str], sig: signal.Signals) -> tuple[str, str]:
    """Signal the process group of process (its own session); SIGKILL it after 30 s."""
    with contextlib.suppress(ProcessLookupError):  # it may have ended meanwhile
        os.killpg(process.pid, sig)
    try:
        return process.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        return process.communicate()


# The longest a benchmark's run may take: the longest here (planner_accuracy's sweep of 8 layouts)
# takes 1-2 min; one still running after this is stuck (a rank, a rendezvous), and the benchmark
# stops with its error rather than waiting out the launcher's own timeouts (15 min).
RUN_LIMIT_S = 600


def runner(*args: str, cwd: str | Path, timeout_s: float = RUN_LIMIT_S) -> str:
    """Run `python -m runner ARGS` in cwd; its standard output. Exits with its error, or if it
    runs longer than timeout_s."""
    done = bounded([sys.executable, "-m", "runner", *args], timeout_s, cwd=cwd)
    if done.returncode:
        sys.exit(f"python -m runner {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return done.stdout


def timed_runner(*args: str, cwd: str | Path) -> float:
    """The wall time of `python -m runner ARGS` in cwd, in seconds."""
    start = time.perf_counter()
    runner(*args, cwd=cwd)
    return time.perf_counter() - start


def training_runs(cwd: str | Path) -> list[Any]:
    """The training runs recorded in cwd's mlflow.db, oldest first."""
    client = MlflowClient(f"sqlite:///{Path(cwd).resolve() / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    return sorted(
        (r for r in runs if r.data.tags.get("mode") == "train"), key=lambda r: r.info.start_time
    )


def last_metrics(cwd: str | Path) -> dict[str, float]:
    return training_runs(cwd)[-1].data.metrics


def machine() -> str:
    """Cores and CPU model, as the benchmarks' table names the machine."""
    model = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
                 if line.startswith("model name")]  # fmt: skip
        model = names[0] if names else model
    return f"{len(os.sched_getaffinity(0))} cores, {model}"


def drift(ratios: Sequence[float]) -> float:
    """How far this machine's speed moved between a benchmark's paired runs: over the rounds, the
    median distance of a round's ratio of the same work's time (forward, loss, backward and
    optimizer, which both sides compute alike) from the rounds' median, as a share of it. What
    the sides do differently leaves that ratio's median, not its spread: the spread is the host's
    (benchmarks/noise.py shows this machine's 10-step windows 260 to 311 samples/s apart)."""
    mid = median(ratios)
    return median(abs(r / mid - 1) for r in ratios)


def raw_target(target: str, moved: float) -> str:
    """A raw ratio's target (">= 0.95"), or that this run cannot judge it: a ratio that must lie
    within `margin` of 1 says nothing of the runner where the same work's time moved more than the
    margin between the sides' runs (the table's met column then says "not judged")."""
    margin = abs(1 - float(target.split()[-1]))
    if moved <= margin:
        return target
    return f"{target}, not judged: the same work's time moved {100 * moved:.0f} % between runs"


def ratio_line(name: str, ratio: float, target: str) -> str:
    """Every benchmark's last line: what is compared, the ratio, and the target."""
    return f"{name}: {ratio:.3f} (target {target})"
