"""Sampled profiler traces (trainer.profile_every_n_steps): Holistic Trace Analysis's breakdown of
a step, checked on known intervals, and on a DDP run of 2 ranks against the timing hooks."""

import json
from pathlib import Path

import pytest
from mlflow import MlflowClient

from runner.metrics import (
    COMM_OVERLAP_FRACTION,
    DEVICE_COMM_FRACTION,
    DEVICE_COMPUTE_FRACTION,
    DEVICE_IDLE_FRACTION,
)
from runner.training.sampled_profile import STEP, SampledProfile, breakdown
from tests.helpers.in_process import Cli
from tests.helpers.jobs import QUICK
from tests.helpers.records import RESUME_RELATIVE, all_runs, loss_series

# A decoder with dropout: a profiler that drew from the random state would change the losses. Its
# gradients (under 1 MiB) fit DDP's first bucket, whose all-reduce starts when backward has ended:
# small buckets start all-reduces while backward still computes, so overlap must be seen.
JOB = ["model=decoder", "model.d_model=64", "model.n_layers=2", "trainer.max_steps=12",
       "data.batch_size=16", "parallel=data", "hardware.devices=2", "parallel.bucket_cap_mb=0.1",
       *QUICK]  # fmt: skip
# The hooks call a phase's whole span compute; the trace only the operators inside it: the trace's
# compute is at most the hooks' (the framework's Python between operators lies in between, 0.05-0.26
# of a step measured on 2 shared cores, too varied to bound from below: what bounds it from below
# here is that the trace finds the operators of every phase).
WITHIN = 0.05  # the hooks time the same steps but the last, the trace the last too
PHASES = {"backward": "autograd::engine::evaluate_function: ", "optimizer": "Optimizer.step#"}


def test_one_step_in_every_n_is_profiled_after_warm_up() -> None:
    sampled = SampledProfile(every=3, cuda=False)
    assert [i for i in range(10) if sampled.wants(i)] == [2, 5, 8]
    assert not any(SampledProfile(every=0, cuda=False).wants(i) for i in range(10))


def test_the_breakdown_is_htas_on_known_intervals() -> None:
    # A 10 s step: compute 0-4 and 5-8, communication 3-6; nothing runs 8-10.
    f = breakdown((0.0, 10.0), [(0.0, 4.0), (5.0, 8.0)], [(3.0, 6.0), (-1.0, 0.0)])
    assert f[DEVICE_COMPUTE_FRACTION.name] == pytest.approx(0.7)
    assert f[DEVICE_COMM_FRACTION.name] == pytest.approx(0.3)  # what lies outside the step is cut
    assert f[DEVICE_IDLE_FRACTION.name] == pytest.approx(0.2)  # 8-10
    assert f[COMM_OVERLAP_FRACTION.name] == pytest.approx(2 / 3)  # 3-4 and 5-6 of 3-6
    idle = (
        1 - f[DEVICE_COMPUTE_FRACTION.name] - f[DEVICE_COMM_FRACTION.name]
    )  # the union, another way
    assert f[DEVICE_IDLE_FRACTION.name] == pytest.approx(
        idle + 2 / 3 * f[DEVICE_COMM_FRACTION.name]
    )


@pytest.mark.slow
def test_a_profiled_ddp_run_agrees_with_its_hooks_and_keeps_its_losses(
    store: str,
    tmp_path: Path,
    cli: Cli,
) -> None:
    for every in (0, 1):  # every step: the trace's steps are the ones the hooks time
        done = cli(*JOB, f"trainer.profile_every_n_steps={every}", cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
    plain, profiled = sorted(all_runs(store), key=lambda r: r.info.start_time)
    assert loss_series(store, profiled.info.run_id) == pytest.approx(
        loss_series(store, plain.info.run_id), rel=RESUME_RELATIVE
    )
    assert DEVICE_IDLE_FRACTION.name not in plain.data.metrics
    m = profiled.data.metrics
    for r in (0, 1):
        idle, compute, comm, overlap = (
            m[f"rank_{r}/{k}"]
            for k in (DEVICE_IDLE_FRACTION.name, DEVICE_COMPUTE_FRACTION.name,
                      DEVICE_COMM_FRACTION.name, COMM_OVERLAP_FRACTION.name)
        )  # fmt: skip
        assert 0 <= idle <= 1 - max(compute, comm)  # idle: neither ran (means over samples)
        assert comm > 0 and overlap > 0  # gloo's all-reduce runs beside backward
        hooks = 1 - m[f"rank_{r}/idle_fraction"]  # the hooks' compute share of the step
        assert 0 < compute <= hooks + WITHIN, (r, hooks, compute)
    local = MlflowClient(store).download_artifacts(
        profiled.info.run_id, "profile.trace.json", str(tmp_path)
    )
    trace = json.loads(Path(local).read_text())  # both ranks' sampled step, one process each
    assert {e["pid"] for e in trace["traceEvents"]} == {0, 1}
    assert any(e.get("name", "").startswith("gloo:") for e in trace["traceEvents"])
    for rank in (0, 1):
        seen = phases_with_operators(trace, rank)
        assert seen == {"forward": True, "backward": True, "optimizer": True}, rank


def phases_with_operators(trace: dict, rank: int) -> dict[str, bool]:
    """The phases inside whose span the trace holds an aten operator on the step's thread (the
    operators the breakdown counts as compute): forward runs from the step's start to backward's
    first function."""
    events = [e for e in trace["traceEvents"] if e.get("pid") == rank and e.get("ph") == "X"]
    step = next(e for e in events if e["name"] == STEP)
    mine = [e for e in events if e["tid"] == step["tid"]]
    ops = [e["ts"] for e in mine if e["name"].startswith("aten::")]
    spans = {phase: [(e["ts"], e["ts"] + e["dur"]) for e in mine if e["name"].startswith(name)]
             for phase, name in PHASES.items()}  # fmt: skip
    spans["forward"] = [(step["ts"], min(start for start, _ in spans["backward"]))]
    return {phase: any(a <= t < b for a, b in found for t in ops) for phase, found in spans.items()}
