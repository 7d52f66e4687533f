"""Snapshots and resume: an interrupted run, resumed, gives the uninterrupted run's losses; broken
or foreign snapshots are refused before anything starts; nothing in a snapshot runs code."""

import json
import pickle
import shutil
from pathlib import Path

import pytest

from runner import validate
from runner.errors import JobFailed
from runner.metrics import LOST_COST, LOST_STEPS
from runner.snapshots import SafeUnpickler, find, identity, moved
from runner.tracking.store import RESUMED_FROM
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
    assert interrupted.data.metrics[LOST_STEPS.name] == 2  # steps 4 and 5, redone from step 4


@pytest.mark.slow
def test_a_single_process_run_resumes_from_its_snapshot(store: str) -> None:
    job = ["model=ffnn", *SNAPSHOTS]
    expected = losses_by_step(store, train(*job))
    first = train("model=ffnn", "checkpoint.every_n_steps=5", "trainer.max_steps=12")
    cfg, _ = compose_job("model=ffnn", *SNAPSHOTS, "resume=auto")
    validate.validate(cfg)
    assert find(cfg).run_id == first  # the newest snapshot: step 10 of the shorter run
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
    assert find(cfg).step == 5


def test_a_snapshot_of_another_model_is_refused_and_of_another_layout_starts_a_new_run(
    store: str,
) -> None:
    run_dir = snapshot_of(store, "model=ffnn")
    cfg, _ = compose_job("model=ffnn", "resume=auto", "model.hidden=[32]")
    validate.validate(cfg)
    with pytest.raises(validate.ConfigError, match="holds another model"):
        find(cfg)
    two = ["model=ffnn", "resume=auto", "parallel=data", "hardware.devices=2"]
    cfg, _ = compose_job(*two)
    validate.validate(cfg)
    found = find(cfg)
    assert found.run_id is None and found.origin == f"{run_dir.name}/step_00000010"
    assert moved(found, cfg).startswith(  # named, not [1, 1, 1]
        f"resume: {found.origin} was written on dp=1 x pp=1 x tp=1, this job runs dp=2 x pp=1"
    )
    # A newer snapshot of the 2-process layout: each job takes its own layout's, newest or not
    other = run_dir.with_name("dp2")
    shutil.copytree(run_dir, other)
    mark = other / "step_00000010" / "runner.json"
    mark.write_text(json.dumps(json.loads(mark.read_text()) | identity(cfg)))
    assert find(cfg).run_id == "dp2"
    one, _ = compose_job("model=ffnn", "resume=auto")
    validate.validate(one)
    assert find(one).run_id == run_dir.name
    # A snapshot keyed by position (an earlier runner's) is passed over, or refused when named
    mark.write_text(json.dumps(json.loads(mark.read_text()) | {"format": 1}))
    assert find(cfg).origin == f"{run_dir.name}/step_00000010"
    cfg, _ = compose_job(*two[:-3], "resume=dp2/step_00000010", *two[-2:])
    validate.validate(cfg)
    with pytest.raises(validate.ConfigError, match="written by an earlier runner"):
        find(cfg)


# Each hop resumes the previous hop's last snapshot on another layout, read by name into other
# shards, stages and expert placements: three runs, whose steps together are one process's.
HOP = 3
HOPS = {
    "decoder": (
        [
            "model=decoder",
            "model.d_model=32",
            "model.n_layers=2",
            "model.dropout=0",
            "data.batch_size=16",
        ],  # fmt: skip
        [
            ["parallel=dp_pp", "parallel.shard=optimizer"],  # stages, ZeRO-1's shares of state
            ["parallel=fsdp_tp", "parallel.shard=gradients"],  # tensor shards, sharded state
            [],  # whole
        ],
    ),
    "moe": (
        [
            "model=moe",
            "model.d_model=32",
            "model.n_layers=2",
            "model.dropout=0",
            "model.capacity_factor=2",
            "model.context_len=32",
            "data.batch_size=8",
        ],  # fmt: skip
        [
            ["parallel=ep"],  # 2 experts a rank
            ["parallel=ep", "parallel.dp=4", "parallel.ep=4"],  # 1 a rank
            ["parallel=moe_3d"],  # 2 a rank again, beside tensor-parallel attention
        ],
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("model", list(HOPS))
def test_a_snapshot_resumes_on_other_layouts_as_one_process_would_go_on(
    store: str, tmp_path: Path, cli: Cli, model: str
) -> None:
    job, hops = HOPS[model]
    single = losses_by_step(store, train(*job, f"trainer.max_steps={HOP * len(hops)}"))
    losses, origin = [], None
    for i, layout in enumerate(hops, start=1):
        resume = [f"resume={origin}"] if origin else []
        steps = [f"trainer.max_steps={HOP * i}", f"checkpoint.every_n_steps={HOP}"]
        done = cli(*job, *QUICK, *layout, *steps, *resume, cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
        run = max(all_runs(store), key=lambda r: r.info.start_time)
        assert run.data.tags.get(RESUMED_FROM) == origin, layout
        assert (f"a new run from its step {HOP * (i - 1)}" in done.stdout) == bool(origin)
        losses += losses_by_step(store, run.info.run_id)
        origin = f"{run.info.run_id}/step_{HOP * i:08d}"
    assert losses == pytest.approx(single, rel=1e-5)


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
    assert run.data.metrics[LOST_STEPS.name] == 4 and run.data.metrics[LOST_COST.name] > 0
    folder = Path("snapshots") / run.info.run_id
    assert sorted(p.name for p in folder.iterdir()) == ["step_00000005", "step_00000010.partial"]
    cfg, _ = compose_job(*job, "resume=auto")
    validate.validate(cfg)  # the mesh resolved, as the runner does
    assert find(cfg)[1:3] == (folder / "step_00000005", 5)  # the half-written one is never taken


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
