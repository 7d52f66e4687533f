"""Each study of experiments/ runs shortened (three steps; its grid as shipped) and ends in its
answer (tests/helpers/studies.py checks what every answer must be); here, what each one's answer
must say about its own question, from its jobs' own runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from runner.config_dirs import EXPERIMENTS_DIR
from runner.metrics import (
    BUBBLE_MEASURED,
    BUBBLE_THEORY,
    COMM_BYTES_PER_STEP,
    COST,
    IDLE_FRACTION,
    LOST_STEPS,
    PEAK_ALLOCATED,
    PEAK_MEMORY,
    PLAN_DEVICE_MEMORY,
    PLAN_FITS,
    PLAN_MEMORY,
    STEP_TIME,
    THROUGHPUT,
    TRAIN_LOSS,
    prediction,
)
from runner.planner.host_figures import Host
from tests.helpers.in_process import Cli
from tests.helpers.jobs import REPOSITORY
from tests.helpers.studies import SHORT, named, run_study

PARALLEL = 1e-5  # a layout's partial sums add in another order (tests/test_tensor.py)


def priced_by_this_host(said: str, threads: int | None, what: str) -> bool:
    """The answer's last sentence names this host's calibration (hardware.figures=host), made
    before the study's first job: the CPU, its cores, the threads a rank, torch, what it ran."""
    host = re.escape(str(Host.here(threads)))
    day = r"\d{4}-\d\d-\d\d"
    calibrated = rf"\({host}; calibrated {day}, {re.escape(what)}\)"
    last = rf"Predictions priced by this host's figures {calibrated}\.$"
    return re.search(last, said) is not None


@pytest.mark.slow
@pytest.mark.alone
def test_bubble_measures_a_bubble_that_falls_with_micro_batches_as_theory_says(
    cli: Cli, tmp_path: Path, seeded: str
) -> None:
    # The study's own model (sixteen layers a stage), GPipe (the seed's schedule; 1F1B reorders
    # the same work: benchmarks/pipeline_bubble measures both) at the grid's two ends, m = 2 and
    # 8: with half the model (eight layers a stage, what a micro-batch costs besides its work
    # weighing twice) 1F1B's m = 8 measured 15.5 to 21.5 % against the theory's 11.1 beside the
    # other worker, once 10.4 pts over (a fresh clone's CI at 032a271); the study as shipped,
    # within 4.1 of it. Alone (`alone`: make test runs it after the rest, nothing beside it):
    # beside the other worker, the fresh clones' CI read GPipe's m = 8 at 25.5 % on an AVX-512
    # Xeon (14.4 pts over; 18.6 % beside two bursty one-thread processes, 19.3 % alone), and on the
    # AVX2 EPYC the planner's m = 2 at 39.9 % against 29.9 measured (its calibration also made
    # beside that load): the load slows one stage and not the other, idle the theory has not.
    ends = ["parallel.schedule=gpipe", "parallel.microbatches=2,8"]  # over the study's own sweep
    a = run_study(cli, tmp_path, seeded, "bubble", *SHORT, "trainer.max_steps=5", *ends)
    grid = [("gpipe", m) for m in (2, 8)]
    assert [(j.data.params["parallel.schedule"], int(j.data.params["parallel.microbatches"]))
            for j in a.jobs] == grid  # fmt: skip
    p = 2
    for number, (_, m) in enumerate(grid, 1):
        theory = (p - 1) / (m + p - 1)
        assert a.jobs[number - 1].data.metrics[BUBBLE_THEORY.name] == pytest.approx(theory)
        assert a.row(number)[5] == f"{100 * theory:.3g}"  # its predicted column, in %
    # The measured lesson, over four timed steps: the bubble falls from m = 2 to m = 8, and at
    # each end it is the theory's (p-1)/(m+p-1) within 10 pts; the planner's idle share is within
    # 10 pts of the measured one at each (the study as shipped: within 5 pts of the theory and of
    # the planner everywhere on the EPYC, docs/studies.md; on the Xeon 8.2 pts over the theory at
    # m = 8, its micro-batches' work half the EPYC's time beside the same sends and Python).
    measured = a.metric(BUBBLE_MEASURED.name)
    idle, planned = a.metric(IDLE_FRACTION.name), a.metric(prediction(IDLE_FRACTION.name))
    at2, at8 = measured
    assert at8 < at2
    theories = [(p - 1) / (m + p - 1) for _, m in grid]
    assert measured == pytest.approx(theories, abs=0.10)
    assert planned == pytest.approx(idle, abs=0.10)
    said = "bubble_fraction_measured, as parallel.microbatches goes 2 → 8: schedule=gpipe falls "
    assert said in a.said
    assert priced_by_this_host(a.said, None, "profile cpu, model ffnn at 32-true"), a.said


@pytest.mark.slow
def test_data_scaling_pays_at_a_large_batch_and_not_at_a_small_one(
    cli: Cli, tmp_path: Path, seeded: str
) -> None:
    a = run_study(cli, tmp_path, seeded, "data_scaling", *SHORT, "trainer.max_steps=6")
    batches = [2, 8, 32, 64]
    assert [(j.data.tags["world_size"], int(j.data.params["data.batch_size"])) for j in a.jobs] == [
        (n, b) for n in ("1", "2") for b in batches
    ]
    # Every rank hands the all-reduce all its gradients, whatever the batch.
    sent = a.metric(COMM_BYTES_PER_STEP.at(dim="dp"))[4:]
    assert (
        len(set(sent)) == 1 and sent[0] == a.metric(prediction(COMM_BYTES_PER_STEP.at(dim="dp")))[4]
    )
    # The lesson, measured: two replicas over one in samples/s grows with the batch, the all-
    # reduce's share shrinking (as shipped, on a quiet host: 0.76x at 2, 1.97x at 64; here four
    # timed steps beside the other test worker, so the order only).
    samples = a.metric(THROUGHPUT.name)
    gain = [two / one for one, two in zip(samples[:4], samples[4:], strict=True)]
    assert gain[-1] > gain[0], gain
    # The planner ties them inside the range: it prices what DDP adds at every batch (with its
    # all-reduce hidden and no DDP cost it priced two replicas faster everywhere). How far its
    # tie lies from the measured one (as shipped: 5.5 planned, 2.8 to 10.2 measured) is held by
    # benchmarks/crossover.py on a quiet host: here, beside another test's load, the measured
    # tie moved to 33.7 once, and out of the range once (the study then says "no tie in the
    # range measured"); the planner's tie is what this holds.
    said = re.search(
        r"data.batch_size (?:\S+ measured|no tie in the range measured), (\S+) as pred/step_time_s",
        a.said,
    )
    assert said, a.said
    assert 2 < float(said.group(1)) < 64
    assert priced_by_this_host(a.said, 1, "profile cpu_core, model decoder at 32-true"), a.said


@pytest.mark.slow
def test_recompute_trades_the_planned_memory_and_keeps_the_losses(
    cli: Cli, tmp_path: Path, seeded: str
) -> None:
    a = run_study(cli, tmp_path, seeded, "recompute", *SHORT)
    by_mode = {j.data.params["trainer.recompute"]: j.data.metrics for j in a.jobs}
    assert list(by_mode) == ["none", "selective", "full"]
    drop = by_mode["none"][PEAK_ALLOCATED.name] - by_mode["full"][PEAK_ALLOCATED.name]
    planned = (
        by_mode["none"][prediction(PEAK_MEMORY.name)]
        - by_mode["full"][prediction(PEAK_MEMORY.name)]
    )
    # Measured here: 0.144 GiB of 0.121 predicted (1.19); each peak within 0.04 GiB of its
    # prediction. The jobs share one process: what tensors held, not the resident memory, which
    # an earlier job's freed memory holds up.
    assert 0.5 < drop / planned < 2, (drop, planned)
    losses = [m[TRAIN_LOSS.name] for m in by_mode.values()]
    assert losses == pytest.approx([losses[0]] * 3, rel=1e-6)  # the same arithmetic again
    assert "is lowest at trainer.recompute=full" in a.said.split(STEP_TIME.name)[0]
    # Its time, a step a third longer for full recomputation as shipped (297 -> 391 ms), is not
    # held here: one timed step beside the other test worker measured "none" at 1.8 s and "full"
    # at 1.2 s once. benchmarks/recompute_time.py holds it on a quiet host.


@pytest.mark.slow
def test_layouts_equal_one_process_and_move_the_planned_bytes(
    cli: Cli, tmp_path: Path, seeded: str
) -> None:
    a = run_study(cli, tmp_path, seeded, "layouts", *SHORT)
    assert [j.data.tags["parallel_option"] for j in a.jobs] == [
        "none", "dp_tp", "dp_pp", "pp_tp", "fsdp_tp"
    ]  # fmt: skip
    assert [j.data.tags["world_size"] for j in a.jobs] == ["1", "4", "4", "4", "4"]
    one, *layouts = a.metric(TRAIN_LOSS.name)
    assert layouts == pytest.approx([one] * 4, rel=PARALLEL)
    for dim in ("dp", "tp", "pp"):
        assert f"pred/comm_bytes_per_step/{dim} exactly" in a.said
    # What each costs in memory, measured as the planner counts it: each layout's tensors' peak
    # within 25 % of its plan (as shipped: planned 0.84 to 1.02 of it). Sharding trades
    # memory for the weights' all-gather: less held than dp_tp, more dp bytes moved.
    memory = a.metric(PEAK_ALLOCATED.name)
    for got, planned in zip(memory, a.metric(prediction(PEAK_MEMORY.name)), strict=True):
        assert 0.75 < planned / got < 1.25, (planned, got)
    by_layout = {j.data.tags["parallel_option"]: j.data.metrics for j in a.jobs}
    sharded, replicated = by_layout["fsdp_tp"], by_layout["dp_tp"]
    assert sharded[PEAK_ALLOCATED.name] < replicated[PEAK_ALLOCATED.name]
    assert sharded[COMM_BYTES_PER_STEP.at(dim="dp")] > replicated[COMM_BYTES_PER_STEP.at(dim="dp")]


@pytest.mark.slow
def test_snapshots_loses_what_lies_past_the_last_snapshot_and_goes_on_past_each_failure(
    cli: Cli, tmp_path: Path, seeded: str
) -> None:
    # The largest interval's every step: the means are over each place a kill can land
    grid = [(every, at) for every in (2, 4) for at in (4, 5, 6, 7)]
    shorter = ["trainer.max_steps=8", "checkpoint.every_n_steps=2,4", "fault.at_step=4,5,6,7"]
    a = run_study(cli, tmp_path, seeded, "snapshots", *SHORT, *shorter)
    assert [(int(j.data.params["checkpoint.every_n_steps"]), int(j.data.params["fault.at_step"]))
            for j in a.jobs] == grid  # fmt: skip
    assert {j.info.status for j in a.jobs} == {"FAILED"}  # each on purpose, the sweep past it
    assert {j.data.tags["failed_rank"] for j in a.jobs} == {"1"}
    assert a.metric(LOST_STEPS.name) == [at % every for every, at in grid]  # past the last snapshot
    # A kill as a step starts loses (interval - 1) / 2 steps on average: half a step short of
    # the planner's half interval, for a failure at any moment
    assert "lost_steps, as checkpoint.every_n_steps goes 2 → 4: rises from 0.5 to 1.5; " in a.said
    assert "half_interval within 0.5 at every point." in a.said
    assert "ended" not in a.said  # no job ended otherwise than the study says


@pytest.mark.slow
def test_plan_gpt3_names_what_does_not_fit_and_the_cheapest_that_does(
    cli: Cli, tmp_path: Path, seeded: str
) -> None:
    a = run_study(cli, tmp_path, seeded, "plan_gpt3")
    fits = a.metric(PLAN_FITS.name)
    assert len(a.jobs) == 8 and 0 < sum(fits) < 8  # type: ignore[arg-type]
    assert named(a.said, "do not fit") == {i for i, f in enumerate(fits, 1) if f == 0}
    for number, job in enumerate(a.jobs, 1):
        memory = job.data.metrics[PLAN_MEMORY.at(memory_part="total")]
        assert (memory <= job.data.metrics[PLAN_DEVICE_MEMORY.name]) == bool(fits[number - 1])
        assert a.row(number)[5] == ("yes" if fits[number - 1] else "**no**")
    # As its expects say: only tp x pp of 64 or more fits 80 GB.
    for job, fit in zip(a.jobs, fits, strict=True):
        shards = int(job.data.params["parallel.tp"]) * int(job.data.params["parallel.pp"])
        assert fit == 0 or shards >= 64, (shards, fit)
    costs = {i: j.data.metrics[COST.name] for i, j in enumerate(a.jobs, 1) if fits[i - 1]}
    cheapest = min(costs, key=costs.__getitem__)
    assert f"The lowest cost_usd of the jobs that finished and fit: #{cheapest} (" in a.said


@pytest.mark.parametrize("doc", ["README.md", "docs/studies.md"])
def test_the_documents_list_every_study_with_the_question_its_file_asks(doc: str) -> None:
    rows = [line.split("|")[1:3] for line in (REPOSITORY / doc).read_text().splitlines()]
    listed = {cells[0].strip(" `"): cells[1].strip() for cells in rows if len(cells) == 2}
    for path in sorted(EXPERIMENTS_DIR.glob("*.yaml")):
        asked = " ".join(yaml.safe_load(path.read_text())["study"]["question"].split())
        assert listed.get(path.stem) == asked, (doc, path.stem)
