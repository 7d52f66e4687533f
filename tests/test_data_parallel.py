"""Data parallelism on processes the runner starts: correct, measured, cleanly stopped."""

import socket
import subprocess
import sys
from pathlib import Path

import pytest
from hydra.utils import instantiate
from mlflow import MlflowClient

from runner.launcher.cluster import free_port
from runner.metrics import (
    COMM_BYTES_PER_STEP,
    COMM_TIME,
    COMPUTE_TIME,
    IDLE_FRACTION,
    IDLE_TIME,
    LOST_COST,
    LOST_ENERGY,
    LOST_STEPS,
    LOST_TIME,
    STEP_TIME,
    THROUGHPUT,
    TRAIN_LOSS,
    prediction,
)
from runner.snapshots import complete
from tests.helpers.in_process import Cli
from tests.helpers.jobs import DP2, QUICK, compose_job, train
from tests.helpers.processes import assert_session_ends, cli_job, stop_session
from tests.helpers.records import all_runs, assert_redone_steps_repeat, loss_series, losses_by_step

STEPS = 10
FFNN = ["model=ffnn", f"trainer.max_steps={STEPS}", "trainer.val_every_n_steps=1000"]
RELATIVE = 1e-5  # fp32: ranks sum the same gradients in another order, nothing else differs


def trainable_params(*overrides: str) -> int:
    cfg, _ = compose_job(*overrides)
    return sum(p.numel() for p in instantiate(cfg.model).parameters() if p.requires_grad)


def job_runs(uri: str) -> dict[str, object]:
    runs = [r for r in all_runs(uri) if r.data.tags.get("mode") == "train"]
    by_world = {r.data.tags["world_size"]: r for r in runs}
    assert len(by_world) == len(runs), "a job ran twice: something re-launched the sweep"
    return by_world


@pytest.mark.slow
def test_data_parallel_loss_equals_the_single_process_run(
    store: str, tmp_path: Path, cli: Cli
) -> None:
    single = loss_series(store, train(*FFNN))
    sweep = ["-m", *FFNN, *QUICK, "parallel=data", "hardware.devices=2,4"]
    done = cli(*sweep, f"logger.tracking_uri={store}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    runs = job_runs(store)
    assert set(runs) == {"1", "2", "4"}  # each sweep job ran once: nothing re-launched the sweep
    for world in ("2", "4"):
        parallel = loss_series(store, runs[world].info.run_id)
        assert len(parallel) == STEPS
        assert parallel == pytest.approx(single, rel=RELATIVE)


@pytest.mark.slow
def test_the_decoder_data_parallel_equals_the_single_process_run(
    store: str,
    tmp_path: Path,
    cli: Cli,
) -> None:
    decoder = ["model=decoder", "model.dropout=0", "trainer.max_steps=10", "data.batch_size=16"]
    single = loss_series(store, train(*decoder))
    done = cli(*decoder, *DP2, *QUICK, f"logger.tracking_uri={store}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    parallel = loss_series(store, job_runs(store)["2"].info.run_id)
    assert parallel == pytest.approx(single, rel=RELATIVE)


@pytest.mark.slow
def test_gradient_traffic_is_counted_where_the_all_reduce_is_called(
    store: str,
    tmp_path: Path,
    cli: Cli,
) -> None:
    args = ["model=ffnn", *DP2, "trainer.max_steps=12", *QUICK, f"logger.tracking_uri={store}"]
    done = cli(*args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    (run,) = all_runs(store)
    m = run.data.metrics
    payload = 4 * trainable_params("model=ffnn")  # fp32 DDP: every gradient, once per step
    assert m[COMM_BYTES_PER_STEP.at(dim="dp")] == payload
    assert m[prediction(COMM_BYTES_PER_STEP.at(dim="dp"))] == payload
    assert m["pred/ring_bytes_per_step/dp"] == 2 * (2 - 1) / 2 * payload
    for rank in (0, 1):
        assert {
            f"rank_{rank}/{k}" for k in (COMPUTE_TIME.name, COMM_TIME.name, IDLE_FRACTION.name)
        } <= set(m)
    assert 0 < m[COMPUTE_TIME.name] < m[STEP_TIME.name]
    assert m[COMPUTE_TIME.name] + m[IDLE_TIME.name] == pytest.approx(m[STEP_TIME.name])
    assert 0 < m[COMM_TIME.name] <= m[IDLE_TIME.name]  # exposed communication is idle time
    assert all(0 < m[f"rank_{r}/idle_fraction"] < 1 for r in (0, 1))
    # Throughput counts the loop's whole interval (data, logging), never less than the step.
    batch = int(run.data.params["data.batch_size"])
    assert m[THROUGHPUT.name] <= batch / m[STEP_TIME.name]
    assert {a.path for a in MlflowClient(store).list_artifacts(run.info.run_id)} >= {"timeline.png"}


@pytest.mark.slow
def test_a_sweep_runs_each_job_once_on_its_own_process_group(
    tmp_path: Path, cli: Cli, seeded: str
) -> None:
    done = cli("-m", "model=neuron", *DP2, "seed=1,2", "trainer.max_steps=6", *QUICK, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    runs = all_runs(seeded)
    (parent,) = [r for r in runs if r.data.tags["mode"] == "sweep"]
    children = [r for r in runs if r is not parent]
    assert sorted(r.data.params["seed"] for r in children) == ["1", "2"]
    assert {r.data.tags["world_size"] for r in children} == {"2"}
    assert {r.data.tags["mlflow.parentRunId"] for r in children} == {parent.info.run_id}


@pytest.mark.slow
def test_a_killed_rank_ends_the_job_and_fails_the_run_naming_it(
    tmp_path: Path, seeded: str
) -> None:
    uri = seeded
    fault = ["fault.kill_rank=1", "fault.at_step=5"]
    with cli_job("model=ffnn", *DP2, "trainer.max_steps=200", *fault, *QUICK, cwd=tmp_path) as job:
        _, stderr = job.communicate(timeout=120)
        assert job.returncode == 1
        assert stderr.strip().splitlines()[-1].startswith("error: rank 1 failed")
        assert_session_ends(job.pid)
    (run,) = all_runs(uri)
    assert (run.info.status, run.data.tags["failed_rank"]) == ("FAILED", "1")
    assert len(loss_series(uri, run.info.run_id)) == 5  # every step logged before is kept


@pytest.mark.slow
def test_a_hung_rank_ends_the_job_at_the_timeout_is_named_and_resumes(
    tmp_path: Path,
    cli: Cli,
    seeded: str,
) -> None:
    uri, timeout = seeded, 4
    fault = ["fault.hang_rank=1", "fault.at_step=3", f"dist.timeout_s={timeout}"]
    job = ["model=ffnn", *DP2, "trainer.max_steps=6", "checkpoint.every_n_steps=2", *fault, *QUICK]
    with cli_job(*job, cwd=tmp_path) as hung:
        _, stderr = hung.communicate(timeout=120)
        assert hung.returncode == 1
        last = stderr.strip().splitlines()[-1]
        assert last.startswith("error: rank 1 failed: stopped taking part at step 3"), last
        assert_session_ends(hung.pid)
    (run,) = all_runs(uri)
    assert (run.info.status, run.data.tags["failed_rank"]) == ("FAILED", "1")
    history = MlflowClient(uri).get_metric_history(run.info.run_id, TRAIN_LOSS.name)
    assert len(history) == 3  # every step logged before is kept
    m = run.data.metrics  # the snapshot holds steps 0 and 1: step 2 and the time held are lost
    assert m[LOST_STEPS.name] == 1 and m[LOST_TIME.name] > timeout
    assert m[LOST_ENERGY.name] > 0 and m[LOST_COST.name] > 0
    # From the last step that finished to the run's end: the timeout, and a few seconds more.
    waited = run.info.end_time / 1000 - max(m.timestamp for m in history) / 1000
    assert timeout <= waited < timeout + 8
    resumed = cli(*job, "resume=auto", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    (run,) = all_runs(uri)
    assert run.info.status == "FINISHED" and len(losses_by_step(uri, run.info.run_id)) == 6
    assert_redone_steps_repeat(uri, run.info.run_id, range(2, 3))
    # The failed attempt stays in the record, but the finished run no longer reads as failed.
    assert "failed_rank" not in run.data.tags and run.data.tags["resumed_after/failed_rank"] == "1"


@pytest.mark.slow
def test_under_torchrun_two_nodes_train_as_one_job_without_a_new_launch(
    tmp_path: Path, seeded: str
) -> None:
    rendezvous = [
        "--nnodes=2",
        "--nproc-per-node=1",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{free_port()}",
        "--local-addr=127.0.0.1",
    ]
    job = ["model=ffnn", "parallel=data", "hardware.nodes=2", "trainer.max_steps=10", *QUICK]
    job.append("checkpoint.every_n_steps=5")  # every rank writes beside the run rank 0 opened
    torchrun = [sys.executable, "-m", "torch.distributed.run", *rendezvous, "-m", "runner", *job]
    nodes = [
        subprocess.Popen(
            torchrun,
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        for _ in range(2)
    ]
    try:
        outputs = [node.communicate(timeout=240)[0] for node in nodes]
    finally:
        for node in nodes:
            stop_session(node)
    assert [node.returncode for node in nodes] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    uri = seeded
    (run,) = all_runs(uri)  # one run, opened by global rank 0 only
    assert (run.info.status, run.data.tags["world_size"]) == ("FINISHED", "2")
    assert len(loss_series(uri, run.info.run_id)) == 10
    # MLflow's system metrics, one series per node: node 1's first rank was handed the run
    sampled = {k.split("/")[1] for k in run.data.metrics if k.startswith("system/")}
    assert sampled == {"node_0", "node_1"}, sampled
    snapshots = complete(tmp_path / "snapshots" / run.info.run_id)
    assert [p.name for p in snapshots] == ["step_00000005", "step_00000010"]


def test_the_killed_rank_is_named_not_the_peer_that_saw_it_die() -> None:
    from types import SimpleNamespace

    from runner.launcher.launch import root_failure

    peer = SimpleNamespace(exitcode=1, timestamp=100, message="read error")  # broken connection
    killed = SimpleNamespace(exitcode=-9, timestamp=101, message="")  # noticed a moment later
    steps = {0: 5, 1: 5}
    assert root_failure({0: peer, 1: killed}, steps)[0] == 1
    late = SimpleNamespace(exitcode=1, timestamp=102, message="read error")
    assert root_failure({0: peer, 1: late}, steps)[0] == 0
    # A hung rank is no failure at all: its peers timed out at a step it never reached.
    rank, why = root_failure({0: peer}, {0: 5, 1: 4})
    assert rank == 1 and "step 5" in why
    assert root_failure({0: peer}, {0: 0, 1: -1})[0] == 1  # hung before its first step


def test_a_ranks_error_is_named_in_one_line() -> None:
    from types import SimpleNamespace

    from runner.launcher.launch import root_failure

    # An error raised in a DDP hook's callback: torch appends the Python frames it came from.
    error = {"message": "RuntimeError: pair closure\n\nAt:\n  default_hooks.py(31): <lambda>\n"}
    failed = SimpleNamespace(exitcode=1, timestamp=100, message=error)
    assert root_failure({0: failed}, {0: 5, 1: 5}) == (0, "RuntimeError: pair closure")


def test_a_rendezvous_port_is_drawn_where_the_kernel_hands_out_none() -> None:
    """free_port's ports lie below the ephemeral range, where no connection's local end can take
    them before rank 0 listens; each is free at once and they are not one fixed number."""
    low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    ports = {free_port() for _ in range(8)}
    assert len(ports) > 1
    for port in ports:
        assert 1024 <= port < low, (port, low, high)
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", port))
