"""Nodes on emulated links (hardware.emulate_network, runner/network/emulation.py): each node's
ranks in a network namespace of its own, its link shaped by tc's token bucket. A shaped link
delivers its rate to gloo's all-reduce and changes no loss; every refusal is one line and leaves
nothing behind; the network goes with the job however it ends, and a killed launcher's at the
next start. Needs root (CI runs as root)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient

from runner import validate
from runner.intervals import union_s
from runner.network import emulation
from runner.network.emulation import PREFIX, emulated, namespaces
from tests.helpers.in_process import Cli
from tests.helpers.jobs import QUICK, REPOSITORY, compose_job
from tests.helpers.records import all_runs, losses_by_step

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="makes network namespaces: needs root")
EMULATED = ["hardware.nodes=2", "hardware.devices=1", "parallel=data",
            "hardware.emulate_network.enabled=true"]  # fmt: skip
DEAD = 4_194_304 + 7  # above the largest pid Linux hands out: a launcher that is gone


def ours(pid: int) -> list[str]:
    return [n for n in namespaces() if n.startswith(f"{PREFIX}{pid}-")]


@pytest.mark.parametrize(
    ("overrides", "said"),
    [
        (["hardware.emulate_network.enabled=true"], "needs hardware.nodes > 1, got 1"),
        ([*EMULATED, "logger.tracking_uri=http://127.0.0.1:5000"], "is out of reach: use a"),
    ],
)
def test_a_refusal_is_one_line_and_makes_nothing(
    tmp_path: Path, cli: Cli, overrides: list[str], said: str
) -> None:
    done = cli(*overrides, cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: hardware.emulate_network: ") and said in last, last
    assert "Traceback" not in done.stderr and ours(os.getpid()) == []


@pytest.mark.parametrize("missing", ["tc", "root"])
def test_a_host_without_tc_or_root_is_refused(
    tmp_path: Path, cli: Cli, monkeypatch: pytest.MonkeyPatch, missing: str
) -> None:
    if missing == "tc":
        found = emulation.shutil.which
        monkeypatch.setattr(emulation.shutil, "which", lambda t: None if t == "tc" else found(t))
    else:
        monkeypatch.setattr(emulation.os, "geteuid", lambda: 1000)
    done = cli(*EMULATED, cwd=tmp_path)
    assert done.returncode == 2
    last = done.stderr.strip().splitlines()[-1]
    assert ("iproute2's tc" if missing == "tc" else "needs root") in last, last


def test_a_name_taken_is_refused_and_the_others_namespace_kept(tmp_path: Path, cli: Cli) -> None:
    taken = f"{PREFIX}{os.getpid()}-n1"
    subprocess.run(["ip", "netns", "add", taken], check=True)
    try:
        done = cli(*EMULATED, cwd=tmp_path)
        assert done.returncode == 2, done.stderr[-2000:]
        last = done.stderr.strip().splitlines()[-1]
        assert f"`ip netns add {taken}` failed" in last, last
        assert ours(os.getpid()) == [taken]  # what it made is gone, what it found is not
    finally:
        subprocess.run(["ip", "netns", "delete", taken], check=True)


def test_the_network_is_shaped_while_the_job_runs_and_gone_after_it() -> None:
    stale = f"{PREFIX}{DEAD}-n0"  # a launcher killed before its clean-up ran
    subprocess.run(["ip", "netns", "add", stale], check=True)
    cfg, _ = compose_job(*EMULATED, "hardware.inter_node.bandwidth_gbs=0.0125")
    validate.validate(cfg)
    with pytest.raises(KeyboardInterrupt), emulated(cfg) as net:  # a Ctrl-C mid-run
        assert stale not in namespaces()
        assert sorted(ours(os.getpid())) == sorted(net.names())
        shown = subprocess.run(
            ["tc", "-n", net.namespace(1), "qdisc", "show", "dev", "eth0"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        assert "tbf" in shown and "rate 100Mbit" in shown, shown
        raise KeyboardInterrupt
    assert ours(os.getpid()) == []


# Gradients of 4.5 MB a step (64 -> 1,024 -> 1,024 -> 10; DDP's buckets of 1 and 3.5 MB) over
# little compute: the link decides
WIDE = ["model=ffnn", "model.hidden=[1024,1024]", "trainer.max_steps=5", "trainer.val_batches=0"]
RATES = (20, 40, 80)  # Mbit/s


def delivered_gbs(store: str, run_id: str, folder: Path, nbytes: float) -> float:
    """A step's all-reduces' bus bandwidth from the later rank's launch of each, as nccl-tests
    times a collective after a barrier: the best of the timeline's steps, what the link carries
    when this 2-core host's other work leaves the ranks alone. (The run's own comm_busbw_gbs
    counts a rank's wait for a late peer as in flight: beside the suite's other tests it read
    0.79 to 0.83 of the rate; the median step, 0.82 at 20 Mbit/s.)"""
    trace = MlflowClient(store).download_artifacts(run_id, "timeline.trace.json", str(folder))
    spans = [e for e in json.loads(Path(trace).read_text())["traceEvents"]
             if e.get("ph") == "X" and e["name"] == "all-reduce"]  # fmt: skip
    ranks = [[(e["ts"], e["ts"] + e["dur"]) for e in spans if e["tid"] == r] for r in (0, 1)]
    joined = [(max(a[0], b[0]), max(a[1], b[1])) for a, b in zip(*ranks, strict=True)]
    steps = [joined[i : i + 2] for i in range(0, len(joined), 2)]  # DDP's two buckets a step
    busy = [union_s([(s / 1e6, e / 1e6) for s, e in step]) for step in steps]
    return nbytes / min(busy) / 1e9  # 2 ranks: bus bytes = payload


@pytest.mark.slow
def test_a_shaped_link_delivers_its_rate_and_changes_no_loss(
    store: str, tmp_path: Path, cli: Cli
) -> None:
    """The link carries its rate and no more: gloo's all-reduce over TCP delivered 0.88 to 0.89
    of it alone (headers, the other way's acknowledgements), 0.82 to 0.84 beside the suite's
    other tests on this 2-core host; the narrower the link, the longer the step's all-reduces."""
    assert cli(*QUICK, *WIDE, "parallel=data", "hardware.devices=2", cwd=tmp_path).returncode == 0
    (unshaped,) = all_runs(store)
    comm = {}
    for mbit in RATES:
        shaped = [*EMULATED, f"hardware.inter_node.bandwidth_gbs={mbit / 8000}"]
        done = cli(*QUICK, *WIDE, *shaped, cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
        assert f"links shaped to {mbit:g} Mbit/s" in done.stdout
        run = max(all_runs(store), key=lambda r: r.info.start_time)
        assert run.data.params["emulated_link.rate_mbit"] == f"{mbit:g}"
        m = run.data.metrics
        nbytes = m["comm_bytes_per_step/dp"]
        assert nbytes > 4e6 and m["comm_busbw_gbs/dp"] <= mbit / 8000, (mbit, m)
        got = delivered_gbs(store, run.info.run_id, tmp_path / str(mbit), nbytes)
        # Shaped: never above the rate (but for the bucket's 16 KiB), never far below it. How
        # close it comes is benchmarks/'s to say, on a quiet host (0.88 to 0.89 alone)
        assert 0.5 < got / (mbit / 8000) <= 1.02, (mbit, got)
        # The network changes time, not numbers (but for gloo's order of summing, 1e-7 here)
        losses = losses_by_step(store, run.info.run_id)
        assert losses == pytest.approx(losses_by_step(store, unshaped.info.run_id), rel=1e-6)
        comm[mbit] = nbytes / got / 1e9  # a step's all-reduces, once both ranks are in them
    assert comm[20] > comm[40] > comm[80], comm  # the narrower the link, the longer
    assert ours(os.getpid()) == []


@pytest.mark.slow
def test_a_failed_or_terminated_job_removes_its_network(
    tmp_path: Path, cli: Cli, seeded: str
) -> None:
    failed = cli(*EMULATED, "model=ffnn", "fault.kill_rank=1", "fault.at_step=2", cwd=tmp_path)
    assert failed.returncode == 1 and ours(os.getpid()) == []
    job = [sys.executable, "-m", "runner", *EMULATED, "model=ffnn", "trainer.max_steps=100000",
           f"logger.tracking_uri={seeded}", "trainer.progress_bar=false"]  # fmt: skip
    launcher = subprocess.Popen(
        job, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env={**os.environ, "PYTHONPATH": str(REPOSITORY)},
    )  # fmt: skip
    try:
        said = ""
        for said in launcher.stdout:  # the network is up once the launcher says so; if it ends
            if said.startswith("hardware.emulate_network:"):  # first, the loop ends with it
                break
        assert said.startswith("hardware.emulate_network:"), said
        assert ours(launcher.pid), "no network while the job runs"
        launcher.send_signal(signal.SIGTERM)
        launcher.communicate(timeout=120)
    finally:
        launcher.kill()  # nothing, where it has ended
    assert ours(launcher.pid) == []
