"""Nodes on emulated links (hardware.emulate_network, runner/network/emulation.py): each node's
ranks in a network namespace of its own, its link shaped by tc's token bucket. A shaped link
delivers its rate to gloo's all-reduce and changes no loss; every refusal is one line and leaves
nothing behind; the network goes with the job however it ends, and a killed launcher's at the
next start. Needs root (CI runs as root)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient
from scipy.stats import spearmanr

from runner import validate
from runner.metrics import (
    COMM_BUSBW,
    COMM_BYTES_PER_STEP,
    IDLE_FRACTION,
    IDLE_TIME,
    STEP_TIME,
    TRAIN_LOSS,
    prediction,
)
from runner.network import emulation
from runner.network.delivered import delivered_gbs
from runner.network.emulation import PREFIX, emulated, namespaces
from runner.stragglers import TAG
from tests.helpers.in_process import Cli
from tests.helpers.jobs import QUICK, REPOSITORY, compose_job
from tests.helpers.records import all_runs, losses_by_step
from tests.helpers.studies import SHORT, run_study

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="makes network namespaces: needs root")
EMULATED = ["hardware.nodes=2", "hardware.devices=1", "parallel=data",
            "hardware.emulate_network.enabled=true"]  # fmt: skip
SLOW = "hardware.emulate_network.slow_nodes"
DEAD = 4_194_304 + 7  # above the largest pid Linux hands out: a launcher that is gone


def ours(pid: int) -> list[str]:
    return [n for n in namespaces() if n.startswith(f"{PREFIX}{pid}-")]


@pytest.mark.parametrize(
    ("overrides", "said"),
    [
        (["hardware.emulate_network.enabled=true"], "needs hardware.nodes > 1, got 1"),
        ([*EMULATED, "logger.tracking_uri=http://127.0.0.1:5000"], "is out of reach: use a"),
        ([*EMULATED, f"{SLOW}=[2]"], "slow_nodes: distinct nodes from 0 to 1 (hardware.nodes=2)"),
        ([*EMULATED, f"{SLOW}=[0,1]"], "slow_nodes: a node slower than the others: not every"),
        ([*EMULATED, f"{SLOW}=[1]", "hardware.emulate_network.slow_share=0"], "between 0 and 1"),
        ([*EMULATED[:-1], f"{SLOW}=[1]"], "slow_nodes: slows emulated links: needs hardware."),
    ],
)
def test_a_refusal_is_one_line_and_makes_nothing(
    tmp_path: Path, cli: Cli, overrides: list[str], said: str
) -> None:
    done = cli(*overrides, cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: hardware.emulate_network") and said in last, last
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
    assert ("iproute2's tc" if missing == "tc" else "or as root of a user namespace") in last, last


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
    cfg, _ = compose_job(
        *EMULATED,
        "hardware.inter_node.bandwidth_gbs=0.0125",
        "hardware.emulate_network.slow_nodes=[1]",
    )
    validate.validate(cfg)
    with pytest.raises(KeyboardInterrupt), emulated(cfg) as net:  # a Ctrl-C mid-run
        assert stale not in namespaces()
        assert sorted(ours(os.getpid())) == sorted(net.names())
        for node, rate in ((0, "rate 100Mbit"), (1, "rate 25Mbit")):  # node 1 slow: 1/4
            shown = subprocess.run(
                ["tc", "-n", net.namespace(node), "qdisc", "show", "dev", "eth0"],
                capture_output=True, text=True, check=True,
            ).stdout  # fmt: skip
            assert "tbf" in shown and rate in shown, shown
        raise KeyboardInterrupt
    assert ours(os.getpid()) == []


# Gradients of 4.5 MB a step (64 -> 1,024 -> 1,024 -> 10; DDP's buckets of 1 and 3.5 MB) over
# little compute: the link decides
WIDE = ["model=ffnn", "model.hidden=[1024,1024]", "trainer.max_steps=5", "trainer.val_batches=0"]
RATES = (20, 40, 80)  # Mbit/s


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
        nbytes = m[COMM_BYTES_PER_STEP.at(dim="dp")]
        assert nbytes > 4e6 and m[COMM_BUSBW.at(dim="dp")] <= mbit / 8000, (mbit, m)
        got = delivered_gbs(MlflowClient(store), run.info.run_id, tmp_path / str(mbit), nbytes)
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


@pytest.mark.slow
def test_the_network_study_is_planned_within_a_fifth_and_ranked_as_measured(
    cli: Cli, tmp_path: Path, seeded: str
) -> None:
    """experiments/network.yaml: the decoder over 2 nodes by data, pipeline and tensor
    parallelism at 20, 40 and 80 Mbit/s, on half its batch. At 20 Mbit/s, where the link takes 90 %
    of every step or more, the planner, given the link, predicts each step within 20% even beside
    the suite's other tests (0.86-1.09 measured so; alone 0.94-1.09: a pipeline's one-way sends
    reach the whole rate, the profile's efficiency is the all-reduce's 0.88). At 40 and 80 Mbit/s
    this busy host's cores decide too (beside test_sharded.py data parallelism read 0.80 of its
    plan at 40 Mbit/s and tensor parallelism 0.57 at 80): there benchmarks/network.py holds every
    job to 20% on a quiet host, and here the planner must rank them. It orders all 9 as measured;
    idle time rises as the link narrows, measured and planned; the rate changes no loss."""
    short = [o for o in SHORT if not o.startswith("trainer.max_steps=")]  # 3 steps timed, not 2
    job = [*short, "trainer.max_steps=4", "data.batch_size=16"]
    a = run_study(cli, tmp_path, seeded, "network", *job)
    layouts, rates = ("data", "pipeline", "tensor"), (0.0025, 0.005, 0.01)
    assert [(j.data.tags["parallel"], float(j.data.params["hardware.inter_node.bandwidth_gbs"]))
            for j in a.jobs] == [(p, r) for p in layouts for r in rates]  # fmt: skip
    measured, planned = a.metric(STEP_TIME.name), a.metric(prediction(STEP_TIME.name))
    for number, (got, guess) in enumerate(zip(measured, planned, strict=True)):
        if number % 3 == 0:  # 20 Mbit/s
            assert 0.8 <= guess / got <= 1.2, (a.jobs[number].data.tags["parallel"], got, guess)
    assert spearmanr(measured, planned).statistic >= 0.9, (measured, planned)
    assert "Spearman" in a.said.split(IDLE_FRACTION.name)[0]
    for i in range(0, 9, 3):  # a layout's three rates, narrowest first
        # In seconds: near saturation the measured share can tie (dp read 87% at 20 Mbit/s, 88%
        # at 40, beside other tests: a rank blocked on a slow link's sends counts as working)
        for key in (IDLE_TIME.name, prediction(IDLE_FRACTION.name)):
            idle = a.metric(key)[i : i + 3]
            assert idle[0] > idle[1] > idle[2], (key, a.jobs[i].data.tags["parallel"], idle)
        losses = a.metric(TRAIN_LOSS.name)[i : i + 3]
        assert losses == pytest.approx([losses[0]] * 3, rel=1e-6)
    assert ours(os.getpid()) == []


@pytest.mark.slow
def test_a_slow_node_is_named_the_straggler_and_the_others_wait_for_it(
    store: str, tmp_path: Path, cli: Cli
) -> None:
    """Node 0's link at a quarter of node 1's (10 of 40 Mbit/s), data parallelism across them:
    rank 0's own work a step (its compute, and its sends' hold on it) reads 5-7x rank 1's, which
    idles the more (measured 0.97 against 0.85)."""
    job = ["model=decoder", "model.dropout=0", "data.batch_size=16", "hardware=ethernet_1g"]
    job += [*EMULATED, "hardware.inter_node.bandwidth_gbs=0.005", f"{SLOW}=[0]", *SHORT]
    done = cli(*job, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    (run,) = all_runs(store)
    assert run.data.params["emulated_link.slow_rate_mbit"] == "10"
    named = run.data.tags[TAG]
    assert named.startswith("node 0, rank 0: "), named
    assert f"straggler: {named}" in done.stderr
    m = run.data.metrics
    assert m["rank_1/idle_fraction"] > m["rank_0/idle_fraction"], m


@pytest.mark.slow
def test_root_of_a_user_namespace_emulates_the_network_and_leaves_the_hosts_alone(
    tmp_path: Path, seeded: str
) -> None:
    """As a user who is not root would (docs/network.md): the runner as root of a user namespace
    of its own, which has no capability on the host (made here by root, the same to the kernel as
    an unprivileged user's). Its namespaces live in the mount namespace that goes with it. Without
    a mount namespace of its own it is refused in one line."""
    if subprocess.run(["unshare", "--user", "--map-root-user", "true"], check=False).returncode:
        pytest.skip("this kernel or sandbox makes no user namespace (unshare --user failed)")
    before = namespaces()
    job = [sys.executable, "-m", "runner", *EMULATED, "model=ffnn", *SHORT,
           f"logger.tracking_uri={seeded}"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPOSITORY)}
    unshare = ["unshare", "--user", "--map-root-user", "--net"]
    done = subprocess.run([*unshare, "--mount", *job], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    (run,) = all_runs(seeded)
    assert run.info.status == "FINISHED"
    assert run.data.params["emulated_link.rate_mbit"] == "10000"  # cpu.yaml's 10 GbE
    assert namespaces() == before  # nothing was made on the host
    refused = subprocess.run([*unshare, *job], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=300)  # fmt: skip
    assert refused.returncode == 2, refused.stderr[-3000:]
    last = refused.stderr.strip().splitlines()[-1]
    assert "needs network and mount namespaces of its own too" in last, last
    assert "Traceback" not in refused.stderr


def test_latency_goes_in_a_netem_qdisc_above_each_links_token_bucket() -> None:
    """Where the kernel has netem (these machines' has not: the runs above go without latency),
    each node's egress is delayed by the profile's latency_us, its token bucket a child of the
    delay; a slow node's bucket at its share of the rate."""
    net = emulation.Network("runner-1", nodes=2, per_node=1, rate_bits=40_000_000,
                            latency_us=50.0, slow=(1,), slow_share=0.25)  # fmt: skip
    delayed, bucket = emulation.shaping(net, 1, delay=True)
    assert delayed[-6:] == ["root", "handle", "1:", "netem", "delay", "50us"]
    assert bucket[bucket.index("parent") :][:6] == ["parent", "1:1", "handle", "10:", "tbf", "rate"]
    assert "10000000bit" in bucket and bucket[:3] == ["tc", "-n", "runner-1-n1"]
    (plain,) = emulation.shaping(net, 0, delay=False)
    assert "40000000bit" in plain and "netem" not in plain
