"""The timing definitions of docs/measurement.md, on a step with known timestamps."""

import pytest

from runner.layouts.probes import Action, Schedule, Transfer
from runner.metrics import (
    COMM_ALGBW,
    COMM_BUSBW,
    COMM_BYTES_PER_STEP,
    COMM_TIME,
    COMPUTE_TIME,
    IDLE_FRACTION,
    IDLE_TIME,
)
from runner.training.callbacks.rank_timing import (
    BUBBLE,
    WINDOW,
    WINDOWS,
    Step,
    combine,
    pipeline_bubble,
)
from runner.training.rank import set_process
from tests.helpers.jobs import compose_job


def a_step() -> Step:
    # forward 0-2 with a 0.5 s loss all-reduce inside; backward 2-4; one bucket all-reduced 3-6
    # (ready at 3, then a second one ready at 4 and done at 6); optimizer 6.5-7.5.
    return Step(
        start=0.0,
        before_backward=2.0,
        after_backward=6.0,
        before_optimizer=6.5,
        end=7.5,
        transfers=[
            Transfer("", "all-reduce", 0.5, 1.0),
            Transfer("dp", "all-reduce", 3.0, 5.0, 400, blocking=False),
            Transfer("dp", "all-reduce", 4.0, 6.0, 100, blocking=False),
        ],
    )


def test_compute_is_forward_backward_and_optimizer_work_only() -> None:
    f = a_step().figures()
    assert f[COMPUTE_TIME.name] == pytest.approx(1.5 + 2.0 + 1.0)
    assert f[COMM_TIME.name] == pytest.approx(2.0 + 0.5)  # after the last bucket, and the sync
    assert f[IDLE_TIME.name] == pytest.approx(7.5 - 4.5)
    assert f[IDLE_FRACTION.name] == pytest.approx(3.0 / 7.5)
    assert f["comm_bytes_dp"] == 500


def test_a_schedules_step_counts_its_actions_and_what_blocked_inside_them() -> None:
    # One stage's step: forward 0-2, a P2P wait 2-3, backward 3-7 with a tensor-parallel
    # all-reduce 4-5 inside it; the tied weights' all-reduce 9-10 closes the window at 10; the
    # optimizer 10-11; Lightning's reduction for logging 11.2-11.4, outside the window.
    schedule = Schedule(
        window=(0.0, 10.0),
        optimizer=(10.0, 11.0),
        actions=[
            Action("F0", 0.0, 2.0, 0),
            Action("wait", 2.0, 3.0, -1),
            Action("B0", 3.0, 7.0, 0),
        ],
        transfers=[Transfer("", "all-reduce", 9.0, 10.0)],
        sent_bytes=128,
    )
    step = Step(
        start=0.0,
        end=11.5,
        schedule=schedule,
        transfers=[
            Transfer("tp", "tp all-reduce", 4.0, 5.0, 64),
            Transfer("", "all-reduce", 11.2, 11.4),
        ],
    )
    f = step.figures()
    assert f[COMPUTE_TIME.name] == pytest.approx(
        2 + 4 - 1 + 1
    )  # actions less the tp wait, optimizer
    assert f[COMM_TIME.name] == pytest.approx(1 + 1 + 1 + 0.2)  # P2P wait, tp, tied, logging
    assert f["bubble_fraction"] == pytest.approx(1 - 5 / 10)
    assert [f[k] for k in WINDOW] == pytest.approx([0.0, 10.0, 5.0])  # the run's bubble, over ranks
    assert (f["comm_bytes_tp"], f["comm_bytes_pp"], f["comm_bytes_dp"]) == (64, 128, 0)
    kinds = [kind for kind, *_ in step.spans(0.0)]
    assert kinds == ["forward", "p2p wait", "backward", "optimizer", "all-reduce", "tp all-reduce",
                     "all-reduce"]  # fmt: skip


def test_the_bubble_is_over_the_pipelines_step_from_the_first_start_to_the_last_end() -> None:
    # GPipe, p = 2, m = 2, forward 1 and backward 2 a micro-batch on each stage. Rank 0: F0 0-1,
    # F1 1-2, B1's gradient at 5, B0 5-7, B1 7-9. Rank 1 starts with rank 0 (the collectives
    # after the last step held it) and ends at 7: F0 1-2, F1 2-3, B1 3-5, B0 5-7; it waits for
    # rank 0's last backward after its window. Theory: (p - 1) / (m + p - 1) = 1/3 on each.
    ranks = [{BUBBLE: 1 - 6 / 9, WINDOWS: [(0.0, 9.0, 6.0)]},
             {BUBBLE: 1 - 6 / 7, WINDOWS: [(0.0, 7.0, 6.0)]}]  # fmt: skip
    assert pipeline_bubble(ranks) == pytest.approx(1 / 3)
    # Two steps, the second 10 s later and a rank's work 3 shorter there: 1/3 and 2/3 idle.
    ranks[0][WINDOWS].append((10.0, 19.0, 3.0))
    ranks[1][WINDOWS].append((10.0, 17.0, 3.0))
    assert pipeline_bubble(ranks) == pytest.approx((1 / 3 + 2 / 3) / 2)
    # A third, as the first but another process held rank 0's core for 10 s (no work done): the
    # median step's 2/3 (steps 1/3, 2/3 and 13/19), not their mean (0.56).
    ranks[0][WINDOWS].append((20.0, 39.0, 6.0))
    ranks[1][WINDOWS].append((20.0, 37.0, 6.0))
    assert pipeline_bubble(ranks) == pytest.approx(2 / 3)
    # A rank without its windows (a figure from before them): each rank's own, averaged.
    del ranks[1][WINDOWS]
    assert pipeline_bubble(ranks) == pytest.approx((1 - 6 / 9 + 1 - 6 / 7) / 2)


def test_the_run_takes_means_over_ranks_and_the_worst_idle_fraction() -> None:
    fast, slow = a_step().figures(), a_step().figures()
    slow[IDLE_FRACTION.name] = 0.9
    figures = combine([fast, slow])
    assert figures[IDLE_FRACTION.name] == pytest.approx((0.4 + 0.9) / 2)
    assert figures["idle_fraction_max"] == 0.9
    assert figures["rank_1/idle_fraction"] == 0.9
    assert figures[COMM_BYTES_PER_STEP.at(dim="dp")] == 500


def test_threads_per_rank_are_cores_over_ranks(monkeypatch) -> None:
    import os

    import torch

    monkeypatch.setattr(os, "sched_getaffinity", lambda _: set(range(8)))
    before = torch.get_num_threads()
    try:
        set_process(compose_job("parallel=data", "hardware.devices=4")[0])
        assert torch.get_num_threads() == 2
        set_process(compose_job("hardware.threads_per_rank=3")[0])
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)


def test_the_bandwidth_delivered_is_nccl_tests_algbw_and_busbw() -> None:
    # a_step's buckets: 500 bytes in flight from 3 to 6 s (3 s); over 4 data-parallel ranks a ring
    # all-reduce puts 2(n-1)/n = 1.5 bytes on each rank's link per byte of payload.
    f = combine([a_step().figures()], {"dp": 4, "tp": 1, "pp": 1})
    assert f[COMM_ALGBW.at(dim="dp")] == pytest.approx(500 / 3 / 1e9)
    assert f[COMM_BUSBW.at(dim="dp")] == pytest.approx(1.5 * 500 / 3 / 1e9)
    # An all-gather's and a reduce-scatter's bus factor is (n-1)/n: 1/2 over 2 ranks; two 1 GB
    # collectives one after the other, 1 s each.
    step = Step(
        start=0.0, before_backward=3.0, after_backward=4.0, before_optimizer=4.0, end=4.0,
        transfers=[Transfer("tp", "tp all-gather", 0.0, 1.0, 10**9),
                   Transfer("tp", "tp reduce-scatter", 1.0, 2.0, 10**9)],
    )  # fmt: skip
    f = combine([step.figures()], {"dp": 1, "tp": 2, "pp": 1})
    assert (f[COMM_ALGBW.at(dim="tp")], f[COMM_BUSBW.at(dim="tp")]) == pytest.approx((1.0, 0.5))
    assert COMM_ALGBW.at(dim="dp") not in f  # one replica: nothing crossed a data-parallel link


class FakeCuda:
    """torch.cuda's events on a device clock the test sets: what the GPU would stamp."""

    def __init__(self) -> None:
        self.device_s, self.synchronized = 0.0, 0
        cuda = self

        class Event:
            def __init__(self, enable_timing: bool) -> None:
                assert enable_timing
                self.at = None

            def record(self) -> None:
                self.at = cuda.device_s

            def elapsed_time(self, other: "Event") -> float:
                return (other.at - self.at) * 1e3  # milliseconds, as CUDA's

        self.Event = Event

    def synchronize(self) -> None:
        self.synchronized += 1


def test_on_a_gpu_a_step_is_read_from_events_with_one_synchronization(monkeypatch) -> None:
    """The GPU's path through the timing callback, with events on a device clock that runs behind
    the host's: the figures are the device's, and the step waits for the device once, at its end."""
    from runner.training.callbacks import rank_timing

    monkeypatch.setattr(rank_timing.clock, "_clock", [rank_timing.HostClock()])  # put back after
    cuda = FakeCuda()
    real = rank_timing.EventClock
    monkeypatch.setattr(rank_timing, "EventClock", lambda: real(cuda))
    timing = rank_timing.RankTiming(warmup_steps=0, cuda=True)
    trainer = type("Trainer", (), {"strategy": object()})()
    timing.on_fit_start(trainer, None)
    assert cuda.synchronized == 1  # the origin: the device idle at a known host time
    expected = a_step()
    for hook, at in (
        (timing.on_train_batch_start, expected.start),
        (timing.on_before_backward, expected.before_backward),
        (timing.on_after_backward, expected.after_backward),
        (timing.on_before_optimizer_step, expected.before_optimizer),
    ):
        cuda.device_s = 100 + at
        hook(trainer)
    for t in expected.transfers:  # what the probes stamp, on the device's streams
        cuda.device_s = 100 + t.start
        start = rank_timing.clock.stamp()
        cuda.device_s = 100 + t.end
        timing._record(Transfer(t.dim, t.kind, start, rank_timing.clock.stamp(), t.nbytes,
                                t.blocking))  # fmt: skip
    cuda.device_s = 100 + expected.end
    timing.on_train_batch_end(trainer)
    assert cuda.synchronized == 2  # one more, after the step
    got = timing.steps[-1].figures()
    assert got == pytest.approx(expected.figures())


def test_a_pipelines_p2p_sends_carry_their_payload_once() -> None:
    # Two batches of sends, 64 bytes each: launched at 0 and 1, waited for until 2 and 3. In
    # flight 0-3; a send's bus factor is 1, whatever the number of stages.
    sends = [Transfer("pp", "p2p", 0.0, 2.0, 64, False), Transfer("pp", "p2p", 1.0, 3.0, 64, False)]
    schedule = Schedule((0.0, 3.0), (3.0, 4.0), [Action("F0", 0.0, 3.0, 0)], [], 128, sends)
    f = combine(
        [Step(start=0.0, end=4.0, schedule=schedule).figures()], {"dp": 1, "tp": 1, "pp": 4}
    )
    assert f[COMM_ALGBW.at(dim="pp")] == f[COMM_BUSBW.at(dim="pp")] == pytest.approx(128 / 3 / 1e9)


def test_the_timeline_draws_every_span_in_its_rank_row_lane_and_kinds_colour() -> None:
    """runner/tracking/pictures.py draws a kind's spans of a row as one collection: each span is
    still a bar at its own time, compute in the row's middle, communication in the band below."""
    from matplotlib.colors import to_rgba

    from runner.tracking.pictures import COLORS, rank_timeline

    t0 = 100.0
    rank0 = [
        [
            ("forward", t0, t0 + 0.002, "f"),
            ("all-reduce", t0 + 0.001, t0 + 0.003, ""),
            ("backward", t0 + 0.002, t0 + 0.005, ""),
        ],
        [("forward", t0 + 0.006, t0 + 0.008, ""), ("optimizer", t0 + 0.008, t0 + 0.009, "")],
    ]
    rank1 = [[("forward", t0 + 0.0005, t0 + 0.002, "")], [("dp wait", t0 + 0.007, t0 + 0.01, "")]]
    fig = rank_timeline([rank0, rank1], "two ranks")
    drawn = set()
    for collection in fig.axes[0].collections:
        colour = tuple(collection.get_facecolor()[0])
        for path in collection.get_paths():
            (x0, y0), (x1, y1) = path.vertices.min(axis=0), path.vertices.max(axis=0)
            drawn.add((colour, round(x0, 6), round(x1, 6), round(y0, 3), round(y1, 3)))
    for row, steps in ((1, rank0), (0, rank1)):  # rank 0 on top
        for kind, a, b, _ in (span for step in steps for span in step):
            comm = kind in ("all-reduce", "dp wait")
            low, high = (row - 0.4, row - 0.2) if comm else (row - 0.15, row + 0.4)
            bar = (to_rgba(COLORS[kind]), round((a - t0) * 1e3, 6), round((b - t0) * 1e3, 6),
                   round(low, 3), round(high, 3))  # fmt: skip
            assert bar in drawn, (kind, row)
    grey = to_rgba(COLORS["idle"])
    idle = {(round(x0, 6), round(x1, 6)) for c, x0, x1, _, _ in drawn if c == grey}
    assert idle == {(0.0, 10.0)}  # behind each row, the whole span of the steps
    assert len(drawn) == 2 + 7  # each rank's idle, and its every span once
