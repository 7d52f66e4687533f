"""Signals as schedulers and people send them end a multi-process job cleanly within seconds, the
job started from a terminal (the runner leads its session) or in the background of a script (which
leaves SIGINT ignored in it): Ctrl-C and SIGTERM fail the run, SIGUSR1 (a time limit's warning)
stops it resumably, and SIGKILL of the launching process takes its ranks with it, its run, left
RUNNING, marked FAILED the next time the runner uses the store."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.in_process import Cli
from tests.helpers.jobs import DP2, QUICK, train
from tests.helpers.processes import (
    assert_session_ends,
    start_cli,
    start_session,
    stop_session,
    wait_for_steps,
)
from tests.helpers.records import all_runs, loss_series, losses_by_step

ENDLESS = ["model=ffnn", *DP2, "trainer.max_steps=100000", *QUICK]
PARALLEL = 1e-5  # two ranks' gradients add in another order than one process's


def in_background_of_a_script(*args: str, cwd: Path) -> subprocess.Popen:
    """`python -m runner ARGS &` in a non-interactive shell, which waits for it: as a batch script
    or a scheduler's wrapper starts a job. The shell leads a session of its own."""
    command = shlex.join([sys.executable, "-m", "runner", *args])
    return start_session(["bash", "-c", f"{command} & wait $!"], cwd)


PARENTS = {"terminal": start_cli, "script": in_background_of_a_script}
# What each signal to the job's whole process group must end in: exit code, run status, last line.
ENDS = {
    signal.SIGINT: (1, "FAILED", "error: "),  # Ctrl-C
    signal.SIGTERM: (1, "FAILED", "error: "),  # scancel, kill
    signal.SIGUSR1: (3, "KILLED", "stopped: preempted"),  # a time limit's warning: resumable
}


def launcher_pid(job: subprocess.Popen) -> int:
    """The runner's own process: the job itself, or the script's child that runs it."""
    if job.args[0] != "bash":
        return job.pid
    children = Path(f"/proc/{job.pid}/task/{job.pid}/children").read_text().split()
    (child,) = children
    return int(child)


@pytest.mark.slow
@pytest.mark.parametrize("parent", PARENTS)
@pytest.mark.parametrize("sig", ENDS, ids=[s.name for s in ENDS])
def test_a_signal_to_the_job_ends_every_process_within_seconds(
    tmp_path: Path,
    parent: str,
    sig: signal.Signals,
    seeded: str,
) -> None:
    uri = seeded
    job = PARENTS[parent](*ENDLESS, cwd=tmp_path)
    try:
        wait_for_steps(tmp_path / "mlflow.db", job, steps=3)
        os.killpg(job.pid, sig)  # the whole group: a script's shell, the launcher, every rank
        # Within seconds: ranks that ignored SIGINT trained on until torch's launcher killed them,
        # 30 s after it forwarded the signal.
        _, stderr = job.communicate(timeout=15)
        assert_session_ends(job.pid)
    finally:
        stop_session(job)
    code, status, last = ENDS[sig]
    code = code if parent == "terminal" else -sig  # a script's shell, in the group, dies of it
    assert job.returncode == code and stderr.strip().splitlines()[-1].startswith(last), stderr
    (run,) = all_runs(uri)
    assert run.info.status == status
    assert len(loss_series(uri, run.info.run_id)) >= 3  # the losses before it kept
    if sig == signal.SIGUSR1:
        step = int(run.data.tags["preempted_at_step"])
        snapshots = tmp_path / "snapshots" / run.info.run_id
        assert (snapshots / f"step_{step:08d}").is_dir(), sorted(snapshots.glob("*"))


@pytest.mark.slow
@pytest.mark.parametrize("parent", PARENTS)
def test_a_launcher_killed_outright_takes_its_ranks_and_its_run_fails_later(
    tmp_path: Path,
    parent: str,
    cli: Cli,
    seeded: str,
) -> None:
    uri = seeded
    job = PARENTS[parent](*ENDLESS, cwd=tmp_path)
    try:
        wait_for_steps(tmp_path / "mlflow.db", job, steps=3)
        launcher = launcher_pid(job)
        os.kill(launcher, signal.SIGKILL)  # the launcher only, as the OOM killer would
        job.wait(timeout=15)
        assert_session_ends(job.pid)  # its fork server and ranks follow it
    finally:
        stop_session(job)
    (killed,) = all_runs(uri)
    assert killed.info.status == "RUNNING"  # nothing could end it
    assert cli("mode=plan", "model=ffnn", *DP2, cwd=tmp_path).returncode == 0
    killed = next(r for r in all_runs(uri) if r.info.run_id == killed.info.run_id)
    assert killed.info.status == "FAILED"
    assert f"pid {launcher} " in killed.data.tags["failed_reason"]
    assert len(loss_series(uri, killed.info.run_id)) >= 3


@pytest.mark.slow
def test_a_job_told_to_stop_snapshots_and_resumes_in_the_same_run(
    store: str,
    tmp_path: Path,
    cli: Cli,
) -> None:
    """SIGUSR1 (SLURM's warning before a time limit) to every rank at step 4: the ranks agree at
    that step, snapshot after it and stop; resume=auto continues the same run to the end, its
    losses those of one process never stopped. A pipeline, whose ranks agree in a collective of
    their own; data parallelism's agree in the loss's mean (reliability.md's example, which the
    docs test runs, stops and resumes one)."""
    layout = ["parallel=pipeline", "hardware.devices=2"]
    model = ["model=ffnn", "model.hidden=[64,64,64]", "trainer.max_steps=10"]
    single = losses_by_step(store, train(*model))
    job = [*model, *layout, *QUICK, f"logger.tracking_uri={store}"]
    stopped = cli(*job, "fault.preempt_at_step=4", cwd=tmp_path)
    assert stopped.returncode == 3, stopped.stderr[-2000:]
    assert stopped.stderr.strip().splitlines()[-1].startswith("stopped: preempted")
    (run,) = [r for r in all_runs(store) if r.data.tags["world_size"] == "2"]
    assert run.info.status == "KILLED" and run.data.tags["preempted_at_step"] == "5"
    resumed = cli(*job, "resume=auto", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    (run,) = [r for r in all_runs(store) if r.data.tags["world_size"] == "2"]
    assert run.info.status == "FINISHED"
    assert losses_by_step(store, run.info.run_id) == pytest.approx(single, rel=PARALLEL)
