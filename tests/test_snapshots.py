"""Snapshots and resume: an interrupted run, resumed, gives the uninterrupted run's losses; broken
or foreign snapshots are refused before anything starts; nothing in a snapshot runs code."""

import pickle
from pathlib import Path

import pytest

from runner import validate
from runner.errors import JobFailed
from runner.snapshots import SafeUnpickler, find
from tests.helpers.in_process import Cli
from tests.helpers.jobs import QUICK, compose_job, train
from tests.helpers.records import (
    RESUME_RELATIVE,
    all_runs,
    assert_redone_steps_repeat,
    losses_by_step,
)

STEPS = 20
SNAPSHOTS = ["checkpoint.every_n_steps=5", f"trainer.max_steps={STEPS}"]
# Data parallelism, killed and resumed; the other layouts' resumes are checked beside their
# single-process equality (test_tensor.py, test_pipeline.py). Dropout draws from every rank's
# generator: a resume must restore each of them.
KILLED = ["model=decoder", "model.d_model=32", "model.dropout=0.1", "data.batch_size=16",
          "parallel=data", "hardware.devices=2", "checkpoint.every_n_steps=4",
          "trainer.max_steps=10"]  # fmt: skip


@pytest.mark.slow
def test_a_killed_run_resumed_equals_the_uninterrupted_one(
    tmp_path: Path, cli: Cli, seeded: str
) -> None:
    job, uri = [*KILLED, *QUICK], seeded
    assert cli(*job, cwd=tmp_path).returncode == 0
    killed = cli(*job, "fault.kill_rank=1", "fault.at_step=6", cwd=tmp_path)
    assert killed.returncode == 1
    resumed = cli(*job, "fault.kill_rank=1", "fault.at_step=6", "resume=auto", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    whole, interrupted = sorted(all_runs(uri), key=lambda r: r.info.start_time)
    assert interrupted.info.status == "FINISHED"  # the same run, finished after the resume
    expected = losses_by_step(uri, whole.info.run_id)
    assert len(expected) == 10
    losses = losses_by_step(uri, interrupted.info.run_id)
    assert losses == pytest.approx(expected, rel=RESUME_RELATIVE)
    assert_redone_steps_repeat(uri, interrupted.info.run_id, range(4, 6))
    assert interrupted.data.metrics["lost_steps"] == 2  # steps 4 and 5, redone from step 4


@pytest.mark.slow
def test_a_single_process_run_resumes_from_its_snapshot(store: str) -> None:
    job = ["model=ffnn", *SNAPSHOTS]
    expected = losses_by_step(store, train(*job))
    first = train("model=ffnn", "checkpoint.every_n_steps=5", "trainer.max_steps=12")
    cfg, _ = compose_job("model=ffnn", *SNAPSHOTS, "resume=auto")
    validate.validate(cfg)
    assert find(cfg)[0] == first  # the newest snapshot: step 10 of the shorter run
    from runner.app import run_job

    run_job(cfg, {"model": "ffnn", "hardware": "cpu", "data": "digits"}, ["resume=auto"])
    assert losses_by_step(store, first) == pytest.approx(expected, rel=RESUME_RELATIVE)


def snapshot_of(store: str, *job: str) -> Path:
    run_id = train(*job, "checkpoint.every_n_steps=5", "trainer.max_steps=10")
    return Path("snapshots") / run_id


def test_a_broken_snapshot_is_refused_and_the_previous_one_offered(store: str) -> None:
    run_dir = snapshot_of(store, "model=ffnn")
    (run_dir / "step_00000010" / "__0_0.distcp").write_bytes(b"")  # truncated by a crash
    cfg, _ = compose_job("model=ffnn", "resume=auto", "trainer.max_steps=20")
    validate.validate(cfg)  # the mesh resolved, as the runner does
    with pytest.raises(validate.ConfigError) as error:
        find(cfg)
    assert "truncated" in str(error.value) and f"resume={run_dir.name}/step_00000005" in str(
        error.value
    )
    cfg, _ = compose_job("model=ffnn", f"resume={run_dir.name}/step_00000005")
    validate.validate(cfg)  # the mesh resolved, as the runner does
    assert find(cfg)[2] == 5


def test_a_snapshot_of_another_model_or_layout_is_refused(store: str) -> None:
    snapshot_of(store, "model=ffnn")
    layout = ["parallel=data", "hardware.devices=2"]
    mesh = "mesh: dp=1 x pp=1 x tp=1, this job has dp=2 x pp=1 x tp=1"  # named, not [1, 2, 1]
    for other, named in ((["model.hidden=[32]"], "model"), (layout, mesh)):
        cfg, _ = compose_job("model=ffnn", "resume=auto", *other)
        validate.validate(cfg)
        with pytest.raises(validate.ConfigError) as error:
            find(cfg)
        assert f"holds another {named}" in str(error.value)


def test_nothing_in_a_snapshot_runs_code() -> None:
    class Payload:
        def __reduce__(self) -> tuple:
            return (print, ("this ran",))

    with pytest.raises(pickle.UnpicklingError):
        SafeUnpickler(__import__("io").BytesIO(pickle.dumps(Payload()))).load()


def test_a_disk_that_fills_while_writing_fails_the_run_and_keeps_the_last_snapshot(
    store: str,
) -> None:
    job = ["model=ffnn", "checkpoint.every_n_steps=5", "trainer.max_steps=20"]
    with pytest.raises(JobFailed, match="rank 0 failed: OSError: .*No space left"):
        train(*job, "fault.disk_full_at_step=10")
    (run,) = all_runs(store)
    assert run.info.status == "FAILED" and run.data.tags["failed_rank"] == "0"
    # Every step's loss, the one whose snapshot failed included; lost work counted as for every
    # fault, from the step the rank had reached (the 10th, index 9) back to the snapshot's 5.
    assert len(losses_by_step(store, run.info.run_id)) == 10
    assert run.data.metrics["lost_steps"] == 4 and run.data.metrics["lost_cost_usd"] > 0
    folder = Path("snapshots") / run.info.run_id
    assert sorted(p.name for p in folder.iterdir()) == ["step_00000005", "step_00000010.partial"]
    cfg, _ = compose_job(*job, "resume=auto")
    validate.validate(cfg)  # the mesh resolved, as the runner does
    assert find(cfg)[1:] == (folder / "step_00000005", 5)  # the half-written one is never taken


def test_resume_auto_without_a_snapshot_starts_afresh_but_a_named_run_is_refused(
    tmp_path: Path,
) -> None:
    """One batch script serves a job's first start and its requeues (docs/slurm.md)."""
    where = f"checkpoint.dir={tmp_path / 'snapshots'}"
    cfg, _ = compose_job("resume=auto", where)
    validate.validate(cfg)  # the mesh resolved, as the runner does
    assert find(cfg) is None
    cfg, _ = compose_job("resume=0123abcd", where)
    validate.validate(cfg)  # the mesh resolved, as the runner does
    with pytest.raises(validate.ConfigError, match="no complete snapshot for resume=0123abcd"):
        find(cfg)
