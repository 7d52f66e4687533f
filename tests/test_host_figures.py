"""hardware.figures=host (runner/planner/host_figures.py, runner/modes/calibrate/host.py): a job
priced with this host's kept calibration merged over its profile, the run saying which priced it.
The calibration itself runs in the studies' tests (tests/test_studies.py), which price with it."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from runner.metrics import STEP_TIME
from runner.planner.host_figures import HOSTS_ENV, Calibrated, Host, load, save
from tests.helpers.in_process import Cli
from tests.helpers.records import all_runs

PLAN = ["mode=plan", "hardware=cpu_core", "parallel=data", "hardware.devices=2"]
# A calibration unlike cpu_core.yaml's in every figure the data-parallel plan reads
KEPT = {
    "peak_tflops": {"fp32": 0.1},
    "compute_efficiency": 0.5,
    "step_overhead_s": 0.002,
    "ddp_overhead_us_per_mb": 100.0,
    "intra_node": {"bandwidth_gbs": 0.5, "latency_us": 500.0},
}
AS_OVERRIDES = [
    "hardware.peak_tflops.fp32=0.1",
    "hardware.compute_efficiency=0.5",
    "hardware.step_overhead_s=0.002",
    "hardware.ddp_overhead_us_per_mb=100",
    "hardware.intra_node.bandwidth_gbs=0.5",
    "hardware.intra_node.latency_us=500",
]


@pytest.fixture
def own_hosts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A hosts folder of the test's own: the planted KEPT figures must not price a later test of
    this worker's session (the data_scaling study's, which calibrates this very key)."""
    folder = tmp_path / "hosts"
    monkeypatch.setenv(HOSTS_ENV, str(folder))
    return folder


def test_a_job_is_priced_by_this_hosts_kept_figures_and_says_so(
    cli: Cli, tmp_path: Path, seeded: str, own_hosts: Path
) -> None:
    host, what = Host.here(1), Calibrated("cpu_core", "decoder", "32-true", split=False)
    assert what.path(host).is_relative_to(own_hosts)  # not the session's, which studies price by
    save(what.path(host), host, what, KEPT | {"power_w": 1.0})  # not a measured figure: dropped
    assert load(what.path(host))["figures"] == KEPT
    store = f"logger.tracking_uri={seeded}"
    for overrides in (["hardware.figures=host"], AS_OVERRIDES, []):
        done = cli(*PLAN, *overrides, store, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
    host_run, by_hand, profile = sorted(all_runs(seeded), key=lambda r: r.info.start_time)
    step = STEP_TIME.name  # a plan logs what it predicts under the figure's own name
    # The kept figures price it exactly as the same figures given by hand, not as the profile's
    assert host_run.data.metrics[step] == by_hand.data.metrics[step]
    assert host_run.data.metrics[step] != profile.data.metrics[step]
    assert host_run.data.params["hardware.peak_tflops.fp32"] == "0.1"
    assert host_run.data.params["hardware.power_w"] == profile.data.params["hardware.power_w"]
    said = host_run.data.tags["priced_by"]
    assert said.startswith(f"this host's figures ({host.cpu}, {host.cores} cores, 1 thread(s)")
    assert str(what) in said
    assert profile.data.tags["priced_by"] == "profile cpu_core"


def test_a_split_calibration_serves_a_job_that_does_not_split(own_hosts: Path) -> None:
    """mode=calibrate measures DTensor's cost on the model split over 2 ranks too: a data-parallel
    job takes its figures rather than calibrating again."""
    from runner.modes.calibrate.host import ensure
    from tests.helpers.jobs import compose_job

    cfg, choices = compose_job(*PLAN, "hardware.figures=host")
    host = Host.here(1)
    split = Calibrated("cpu_core", "decoder", "32-true", split=True)
    assert split.path(host).is_relative_to(own_hosts)
    save(split.path(host), host, split, KEPT)
    assert ensure(cfg, choices)["figures"] == KEPT


def test_under_torchrun_a_host_with_no_calibration_is_told_how_to_make_one(
    cli: Cli, tmp_path: Path, seeded: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every rank would calibrate at once: one line says how to calibrate first."""
    monkeypatch.setenv(HOSTS_ENV, str(tmp_path / "none"))
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "test")
    for name, value in {"WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(name, value)
    done = cli("mode=plan", "hardware=cpu_core", "hardware.figures=host",
               f"logger.tracking_uri={seeded}", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("error: hardware.figures: host: this host (")
    assert "mode=calibrate hardware=cpu_core model=decoder trainer.precision=32-true" in line


def test_the_host_key_names_the_cpu_its_cores_threads_and_torch() -> None:
    here, one = Host.here(None), Host.here(1)
    assert here.cores == len(os.sched_getaffinity(0)) == here.threads
    assert one.threads == 1 and one.key != Host(here.cpu, here.cores, 2, here.torch).key
    assert re.fullmatch(r"[a-z0-9.+-]+", one.key) and one.key.endswith(f"torch{one.torch}")
    assert f"-{one.cores}cores-1threads-" in one.key


def test_what_ddp_adds_is_read_through_a_burst_of_load_that_lands_on_one_side(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The calibration's DDP cost is the median of paired differences (a plain step, then a DDP
    step, alternated): a burst of another process's load as long as a quarter of the pairs slows
    both steps of the pairs it covers alike. Timed one after the other, the same burst covered the
    plain steps alone and read DDP's cost as 0 (a fresh clone's CI at e1e5392)."""
    from runner.modes import calibrate

    now = [0.0]
    burst = (0.0, 0.4)  # the first 0.4 s of the clock: 7 of the 25 pairs, 13 of 25 plain steps
    monkeypatch.setattr(calibrate.time, "perf_counter", lambda: now[0])

    def taking(seconds: float):
        def call() -> None:
            now[0] += seconds + (0.02 if burst[0] <= now[0] < burst[1] else 0.0)

        return call

    plain, ddp = taking(0.010), taking(0.012)  # DDP adds 2 ms
    pairs = 25  # calibrate.LINK_REPEATS
    assert calibrate.paired_difference(plain, ddp, pairs) == pytest.approx(0.002)
    # The same burst over the first of two runs timed one after the other: their medians' difference
    # is no cost at all
    now[0] = 0.0
    first = [calibrate.timed(plain, calibrate.CPU) for _ in range(pairs)]
    second = [calibrate.timed(ddp, calibrate.CPU) for _ in range(pairs)]
    assert sorted(first)[pairs // 2] > sorted(second)[pairs // 2]
