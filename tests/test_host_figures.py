"""hardware.figures=host (runner/planner/host_figures.py, runner/modes/calibrate/host.py): a job
priced with this host's kept calibration merged over its profile, the run saying which priced it.
The calibration itself runs in the studies' tests (tests/test_studies.py), which price with it."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
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


class LoadedClock:
    """time.perf_counter as the test drives it: a call taking `seconds` moves it on, 20 ms more
    where it starts inside a burst of another process's load."""

    def __init__(self, burst: tuple[float, float]) -> None:
        self.now, self.burst = 0.0, burst

    def __call__(self) -> float:
        return self.now

    def taking(self, seconds: float) -> Callable[..., None]:
        def call(*_: object) -> None:
            start, end = self.burst
            self.now += seconds + (0.02 if start <= self.now < end else 0.0)

        return call


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> LoadedClock:
    """A burst over the clock's first 0.4 s: 7 of 25 pairs of 10 and 12 ms calls, 13 of 25 calls
    of 10 ms timed one after the other."""
    import time

    loaded = LoadedClock((0.0, 0.4))
    monkeypatch.setattr(time, "perf_counter", loaded)
    return loaded


def test_what_ddp_adds_is_read_through_a_burst_of_load_that_lands_on_one_side(
    clock: LoadedClock,
) -> None:
    """The calibration's DDP cost is the median of paired differences (a plain step, then a DDP
    step, alternated): a burst of another process's load as long as a quarter of the pairs slows
    both steps of the pairs it covers alike. Timed one after the other, the same burst covered the
    plain steps alone and read DDP's cost as 0 (a fresh clone's CI at e1e5392)."""
    from runner.modes import calibrate

    plain, ddp = clock.taking(0.010), clock.taking(0.012)  # DDP adds 2 ms
    pairs = 25  # calibrate.LINK_REPEATS
    assert calibrate.paired_difference(plain, ddp, pairs) == pytest.approx(0.002)
    # The same burst over the first of two runs timed one after the other: their medians'
    # difference is no cost at all
    clock.now = 0.0
    first = [calibrate.timed(plain, calibrate.CPU) for _ in range(pairs)]
    second = [calibrate.timed(ddp, calibrate.CPU) for _ in range(pairs)]
    assert sorted(first)[pairs // 2] > sorted(second)[pairs // 2]


def test_what_the_runner_adds_to_a_plain_step_is_read_step_by_step(
    clock: LoadedClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """mode=calibrate follows each of the runner's steps with a plain loop's step on the same
    model and optimizer (runner/modes/calibrate/paired_step.py): the runner's overhead is the
    median of their differences, the plain step the median of its own, whatever burst covers a
    quarter of the steps. Here the runner's step takes 12 ms, the plain one 10."""
    import torch
    from omegaconf import OmegaConf

    from runner.modes.calibrate import paired_step

    plain_step = clock.taking(0.010)
    monkeypatch.setattr(paired_step.plain_loop, "step", plain_step)
    cfg = OmegaConf.create({"data": {"loss": "mse"}, "trainer": {"precision": "32-true"}})
    beside = paired_step.PlainStepBeside(cfg, warmup=2, device=torch.device("cpu"))
    model = torch.nn.Linear(2, 2)
    module = type("Module", (), {"model": model})()
    trainer = type("Trainer", (), {"optimizers": [torch.optim.SGD(model.parameters(), lr=0.1)]})()
    beside.batch = (torch.zeros(1, 2), torch.zeros(1, 2))
    runner_work = clock.taking(0.012)
    for _ in range(27):  # 2 warm-up steps, 25 pairs
        beside.on_train_batch_start(trainer, module)
        runner_work()
        beside.on_train_batch_end(trainer, module)
    assert len(beside.runner) == len(beside.plain) == 25
    assert beside.overhead_s() == pytest.approx(0.002)
    assert beside.plain_s() == pytest.approx(0.010)
    assert not trainer.should_stop  # 25 pairs of 22 ms: inside the budget, all of max_steps run
    # A model whose pairs fill the budget sooner: the run stops after the fewest pairs that do
    monkeypatch.setattr(paired_step, "BUDGET_S", 0.05)
    beside = paired_step.PlainStepBeside(cfg, warmup=2, device=torch.device("cpu"))
    beside.batch = (torch.zeros(1, 2), torch.zeros(1, 2))
    for _ in range(27):
        beside.on_train_batch_start(trainer, module)
        runner_work()
        beside.on_train_batch_end(trainer, module)
        if trainer.should_stop:
            break
    assert len(beside.runner) == paired_step.MIN_PAIRS  # 4 pairs: 0.088 s, past 0.05


def test_a_product_longer_than_its_budget_is_timed_by_its_one_call(clock: LoadedClock) -> None:
    """A product size whose first call outlasts the calibration's budget a size (bf16 on a CPU
    without bf16 instructions: 2.3 s a 1,024-square product on the AVX2 EPYC, budget 1 s) is
    timed by that call alone; one inside the budget gets as many calls as fit, at least one,
    and the shortest counts."""
    from runner.modes import calibrate

    calls: list[float] = []

    def product(seconds: float) -> Callable[[], None]:
        take = clock.taking(seconds)
        return lambda: (calls.append(seconds), take())[1]

    clock.now = 1.0  # past the fixture's burst
    assert calibrate.best_time(product(2.3), 5, calibrate.CPU, budget_s=1.0) == pytest.approx(2.3)
    assert len(calls) == 1
    calls.clear()
    assert calibrate.best_time(product(0.3), 5, calibrate.CPU, budget_s=1.0) == pytest.approx(0.3)
    assert len(calls) == 1 + 3  # the warm-up, then int(1.0 / 0.3) timed calls
    calls.clear()
    assert calibrate.best_time(product(0.3), 5, calibrate.CPU) == pytest.approx(0.3)
    assert len(calls) == 1 + 5  # no budget (the links, timed alike on every rank): every repeat
