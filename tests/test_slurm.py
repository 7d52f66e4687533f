"""The runner on a real SLURM (tests/helpers/one_node_slurm.py): srun jobs of each layout record
one run with every rank's figures; a task layout that does not match the mesh is refused in one
line; a sweep submitted through Hydra's submitit launcher (hydra/launcher=slurm) asks for each
job's mesh and nests a child run per job under one parent, the jobs running at once, a failed one
named; a preempted job snapshots, is requeued by the runner and resumes in the same run."""

from __future__ import annotations

import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runner.launcher.cluster import free_port
from tests.helpers.jobs import QUICK, train
from tests.helpers.one_node_slurm import (
    Unavailable,
    cluster_said,
    one_node_slurm,
    stragglers,
    until,
)
from tests.helpers.records import all_runs, losses_by_step

SHORT = ["trainer.max_steps=6", *QUICK]
WAIT_S = 120  # an srun job of 6 steps ends in about 10 s here; a sweep of two in under a minute
RELATIVE = 1e-5  # fp32: ranks sum the same gradients in another order, nothing else differs
LAYOUTS = {  # 2 ranks each, the FFNN split in a column/row pair per pipeline stage
    "data": ["parallel=data"],
    "pipeline": ["parallel=pipeline", "parallel.microbatches=2"],
    "tensor": ["parallel=tensor"],
}


@pytest.fixture(scope="module")
def slurm() -> Iterator[dict[str, str]]:
    try:
        with one_node_slurm() as env:
            yield env
    except Unavailable as why:
        pytest.skip(str(why))


def run(
    env: dict[str, str], cwd: Path, *command: str, limit_s: float = WAIT_S
) -> subprocess.CompletedProcess:
    """The command, then none of the cluster's job processes left (srun, steps, tasks). A command
    still running after limit_s fails the test with what it and the cluster said, its jobs
    cancelled (killing srun alone would leave its tasks running under slurmstepd)."""
    env = {k: v for k, v in env.items() if k != "MLFLOW_TRACKING_URI"}
    try:
        done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=limit_s)  # fmt: skip
    except subprocess.TimeoutExpired as late:
        queue = subprocess.run(["squeue", "-a", "-s"], env=env, capture_output=True, text=True)
        subprocess.run(["scancel", "--partition=debug"], env=env, capture_output=True)
        printed = [(o or b"").decode(errors="replace")[-3000:] for o in (late.stdout, late.stderr)]
        pytest.fail(
            f"{command[0]} still running after {limit_s:.0f} s\n--- stdout\n{printed[0]}\n"
            f"--- stderr\n{printed[1]}\n--- squeue\n{queue.stdout}\n{cluster_said(env)}"
        )
    assert until(lambda: not stragglers(env["SLURM_CONF"]), 10), stragglers(env["SLURM_CONF"])
    return done


def loopback(env: dict[str, str]) -> dict[str, str]:
    # The rendezvous on 127.0.0.1 (the runner then binds gloo to loopback), not at the address
    # Lightning would resolve from the node's name, and on a free port, not one derived from the
    # job id (another test cluster on this host numbers its jobs from 1 too).
    return env | {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}


def srun(env: dict[str, str], cwd: Path, tasks: list[str], *args: str) -> Any:
    return run(loopback(env), cwd, "srun", "-N1", *tasks, sys.executable, "-m", "runner", *args)


def job_state(env: dict[str, str], job: str) -> tuple[str, int]:
    """The job's state and how often it was requeued."""
    shown = subprocess.run(["scontrol", "-o", "show", "job", job], env=env, capture_output=True,
                           text=True).stdout  # fmt: skip
    fields = dict(f.split("=", 1) for f in shown.split() if "=" in f)
    return fields.get("JobState", ""), int(fields.get("Restarts", "0"))


@pytest.mark.slow
@pytest.mark.timeout(len(LAYOUTS) * WAIT_S + 60)
def test_srun_runs_each_layout_as_one_job(
    slurm: dict[str, str], tmp_path: Path, seeded: str
) -> None:
    uri = seeded
    model = ["model=ffnn", "model.hidden=[64,64,64]", "hardware.devices=2", *SHORT]
    for layout in LAYOUTS.values():
        done = srun(slurm, tmp_path, ["--ntasks-per-node=2"], *model, *layout)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "auto-requeueing enabled" not in done.stdout + done.stderr  # Lightning's is off
    runs = {r.data.tags["parallel"]: r for r in all_runs(uri)}
    assert set(runs) == set(LAYOUTS) and len(all_runs(uri)) == 3  # one run per job, not per task
    for run in runs.values():
        assert run.info.status == "FINISHED" and run.data.tags["world_size"] == "2"
        for rank in (0, 1):
            assert run.data.metrics[f"rank_{rank}/compute_time_s"] > 0


@pytest.mark.slow
@pytest.mark.parametrize(
    ("tasks", "layout", "asks"),
    [
        (["-n2"], ["parallel=data", "hardware.devices=2"], "--ntasks-per-node=2"),
        (["--ntasks-per-node=2"], ["parallel=dp_tp"], "--ntasks-per-node=4"),
    ],
    ids=["ntasks", "too-few"],
)
def test_a_task_layout_that_does_not_match_is_refused_in_one_line(
    slurm: dict[str, str], tmp_path: Path, tasks: list[str], layout: list[str], asks: str
) -> None:
    done = srun(slurm, tmp_path, tasks, "model=ffnn", *layout, *SHORT)
    assert done.returncode == 2
    mine = [line for line in done.stderr.splitlines() if not line.startswith("srun: ")]
    assert len(mine) == 1 and mine[0].startswith("error: ") and asks in mine[0], done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "mlflow.db").exists()  # no run opened, none left RUNNING


@pytest.mark.slow
def test_a_sweep_on_slurm_asks_for_each_mesh_and_names_a_failed_job_once_the_others_finish(
    slurm: dict[str, str],
    tmp_path: Path,
    seeded: str,
) -> None:
    """hydra/launcher=slurm: each job one SLURM job of a task per rank, warned by SIGUSR1; the
    jobs nest under one parent and run at once; rank 1 of one job is killed at step 3: that job's
    run is FAILED and the sweep names it, after the other has finished."""
    uri = seeded
    sweep = ["-m", "hydra/launcher=slurm", "model=ffnn", "parallel=data", "hardware.devices=2",
             "fault.kill_rank=null,1", "fault.at_step=3", *SHORT]  # fmt: skip
    env = slurm | {"MASTER_ADDR": "127.0.0.1"}  # each job's port from its job id
    done = run(env, tmp_path, sys.executable, "-m", "runner", *sweep)
    assert done.returncode == 1, done.stderr[-3000:]
    named = [line for line in done.stderr.splitlines() if "Error executing job" in line]
    assert len(named) == 1 and "fault.kill_rank=1" in named[0], done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1].startswith("error: "), done.stderr[-3000:]
    scripts = sorted(tmp_path.glob("multirun/**/*_submission.sh"))
    assert len(scripts) == 2
    for script in scripts:
        sbatch = script.read_text()
        for asked in ("--ntasks-per-node=2", "--cpus-per-task=1", "--signal=USR1@90"):
            assert f"#SBATCH {asked}\n" in sbatch, sbatch
    runs = all_runs(uri)
    (parent,) = [r for r in runs if r.data.tags.get("mode") == "sweep"]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(runs) == 3 and parent.info.status == "FAILED"
    (ok,) = [c for c in children if c.data.params["fault.kill_rank"] == "None"]
    (killed,) = [c for c in children if c != ok]
    assert ok.info.status == "FINISHED" and ok.data.metrics["rank_1/compute_time_s"] > 0
    # Under srun no launcher sees rank 1 die: rank 0, left on a broken connection, records it.
    assert killed.info.status == "FAILED" and killed.data.tags["failed_rank"] == "0"
    assert ok.data.tags["world_size"] == killed.data.tags["world_size"] == "2"
    assert ok.info.start_time < killed.info.end_time  # at once: the cluster had room
    assert killed.info.start_time < ok.info.end_time


@pytest.mark.slow
def test_a_preempted_job_snapshots_is_requeued_and_resumes_in_the_same_run(
    slurm: dict[str, str], store: str, tmp_path: Path
) -> None:
    """One batch script, as docs/slurm.md's: resume=auto starts afresh the first time. SIGUSR1
    reaches both tasks at step 8 (fault.preempt_at_step, as --signal=USR1@T sends it): they
    snapshot, the run ends KILLED, the runner requeues the job, and the requeued job continues the
    run to its end, its losses those of one process never stopped."""
    model = ["model=ffnn", "model.hidden=[64,64,64]", "trainer.max_steps=20"]
    single = losses_by_step(store, train(*model))
    job = [*model, "parallel=pipeline", "hardware.devices=2", *QUICK,
           f"logger.tracking_uri={store}", "resume=auto", "fault.preempt_at_step=8"]  # fmt: skip
    script = tmp_path / "job.sh"
    script.write_text(f"#!/bin/bash\nsrun {shlex.join([sys.executable, '-m', 'runner', *job])}\n")
    env = {k: v for k, v in loopback(slurm).items() if k != "MLFLOW_TRACKING_URI"}
    sbatch = ["sbatch", "--parsable", "--requeue", "-N1", "--ntasks-per-node=2",
              f"--output={tmp_path}/slurm-%j.out", str(script)]  # fmt: skip
    submitted = subprocess.run(sbatch, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert submitted.returncode == 0, submitted.stderr
    number = submitted.stdout.strip().split(";")[0]
    printed = lambda: "".join(p.read_text() for p in tmp_path.glob("slurm-*.out"))  # noqa: E731
    said = lambda: f"{printed()}\n{job_state(env, number)}\n{cluster_said(env)}"  # noqa: E731
    assert until(lambda: job_state(env, number) == ("PENDING", 1), 120), said()
    # SLURM holds a requeued job for two minutes before it may start again: start it sooner, but
    # not within the second its processes were killed in. slurmd refuses a credential issued in
    # that second as revoked, and SLURM then holds the job for good ("launch failed requeued held").
    subprocess.run(
        ["scontrol", "update", f"jobid={number}", "StartTime=now+2"], env=env, check=True
    )
    assert until(lambda: job_state(env, number)[0] == "COMPLETED", 120), said()
    assert until(lambda: not stragglers(env["SLURM_CONF"]), 10), stragglers(env["SLURM_CONF"])
    (run,) = [r for r in all_runs(store) if r.data.tags["world_size"] == "2"]
    assert run.info.status == "FINISHED", printed()
    assert run.data.tags["preempted_at_step"] == "9"
    assert run.data.tags["requeue"] == f"requeued SLURM job {number}"
    assert losses_by_step(store, run.info.run_id) == pytest.approx(single, rel=RELATIVE)
