"""Pipeline parallelism: every schedule equals the single-process run; bad layouts refused."""

import json
from pathlib import Path

import pytest
from mlflow import MlflowClient

from runner import choices, validate
from runner.metrics import BUBBLE_MEASURED, BUBBLE_THEORY, COMM_BYTES_PER_STEP, prediction
from tests.helpers.in_process import Cli
from tests.helpers.jobs import QUICK, compose_job, train
from tests.helpers.metrics import assert_registered
from tests.helpers.records import (
    all_runs,
    assert_redone_steps_repeat,
    forget_snapshots_of_step,
    loss_series,
    losses_by_step,
)

STEPS = 8
RELATIVE = 1e-5  # fp32: micro-batch gradients are summed in another order, nothing else differs
# Models with enough layers for 2 virtual stages per rank; small, so that a step is quick.
MODELS = {
    2: {
        "ffnn": ["model=ffnn", "model.hidden=[64,32,32]"],
        "decoder": ["model=decoder", "model.n_layers=4", "model.d_model=32", "model.dropout=0"],
    },
    4: {
        "ffnn": ["model=ffnn", "model.hidden=[64,48,48,32,32,32,16]"],
        "decoder": ["model=decoder", "model.n_layers=8", "model.d_model=32", "model.dropout=0"],
    },
}
COMMON = [f"trainer.max_steps={STEPS}", "trainer.val_every_n_steps=4", "data.batch_size=16"]
# The decoder at P = 2 also snapshots at steps 4 and 8, each schedule into a folder of its own;
# with step 8 removed, every schedule resumes and redoes steps 5 to 8.
RESUMED = (2, "decoder")
SNAPSHOTS = ["checkpoint.every_n_steps=4", "checkpoint.dir='snapshots/${parallel.schedule}'"]
SCHEDULE_SWEEPS = [
    ["parallel.schedule=gpipe,1f1b", "parallel.virtual_stages=1"],
    ["parallel.schedule=interleaved_1f1b,zero_bubble", "parallel.virtual_stages=2"],
]


@pytest.mark.slow
# P = 4 with the FFNN, P = 2 with the decoder (its interleaved schedules run 4 stages on 2 ranks,
# and it snapshots and resumes): the other two pairs add nothing these do not check, and the
# suite's time is bounded (25 minutes on 2 cores).
@pytest.mark.parametrize(("devices", "model"), [(2, "decoder"), (4, "ffnn")])
def test_every_schedule_equals_the_single_process_run(
    store: str, tmp_path: Path, cli: Cli, devices: int, model: str
) -> None:
    job = [*MODELS[devices][model], *COMMON]
    single = loss_series(store, train(*job))
    layout = ["parallel=pipeline", f"hardware.devices={devices}", "parallel.microbatches=4"]
    resumed = (devices, model) == RESUMED
    if resumed:
        layout += SNAPSHOTS
    run_every_schedule(cli, tmp_path, store, *job, *layout)
    if resumed:
        forget_snapshots_of_step(tmp_path / "snapshots", STEPS)
        run_every_schedule(cli, tmp_path, store, *job, *layout, "resume=auto")
    runs = [r for r in all_runs(store) if r.data.tags.get("parallel") == "pipeline"]
    assert sorted(r.data.params["parallel.schedule"] for r in runs) == sorted(choices.SCHEDULES)
    for run in runs:
        losses = losses_by_step(store, run.info.run_id)
        assert losses == pytest.approx(single, rel=RELATIVE), run.info.run_name
        if resumed:
            assert_redone_steps_repeat(store, run.info.run_id, range(4, STEPS))


def run_every_schedule(cli: Cli, tmp_path: Path, store: str, *job: str) -> None:
    for sweep in SCHEDULE_SWEEPS:
        done = cli("-m", *job, *sweep, *QUICK, f"logger.tracking_uri={store}", cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["hardware.devices=4"], "parallel.pp"),  # 4 stages, 3 layers
        (["parallel.microbatches=5"], "parallel.microbatches"),  # 64 does not split into 5
        (["parallel.microbatches=1"], "parallel.microbatches"),  # 1f1b: one per stage at least
        (["parallel.schedule=chimera"], "parallel.schedule"),
        (["parallel.virtual_stages=2"], "parallel.virtual_stages"),  # 1f1b has none
        (["parallel.split=[1,1]"], "parallel.split"),  # 2 layers of 3
        (  # interleaved schedules run micro-batches in rounds of pp: 5 is not 2 rounds of 2
            [
                "parallel.schedule=interleaved_1f1b",
                "parallel.virtual_stages=2",
                "model.hidden=[8,8,8]",
                "parallel.microbatches=5",
                "data.batch_size=30",
            ],
            "parallel.microbatches",
        ),
    ],
)
def test_bad_layouts_are_refused_before_launch(overrides: list[str], key: str) -> None:
    cfg, _ = compose_job("model=ffnn", "parallel=pipeline", "hardware.devices=2", *overrides)
    with pytest.raises(validate.ConfigError) as error:
        validate.validate(cfg)
    assert error.value.key == key


@pytest.mark.slow
def test_the_seeds_pipeline_is_measured_drawn_and_tabled(
    tmp_path: Path, cli: Cli, seeded: str
) -> None:
    done = cli("+experiment=seed_pipeline", "trainer.max_steps=8", *QUICK, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    uri = seeded
    (run,) = all_runs(uri)
    m = run.data.metrics
    # The P2P payloads really sent are the activations and gradients the formula counts.
    assert (
        m[COMM_BYTES_PER_STEP.at(dim="pp")]
        == m[prediction(COMM_BYTES_PER_STEP.at(dim="pp"))]
        == 2 * 64 * 3 * 64 * 4 / 4
    )
    assert m[BUBBLE_THEORY.name] == pytest.approx(3 / 7)
    # 4 ranks on 2 cores, each layer's work emulated (a device's, its rank asleep): the measured
    # bubble is the theory's, within 2 pts as shipped (docs/studies.md), 10 beside other tests.
    assert m[BUBBLE_MEASURED.name] == pytest.approx(3 / 7, abs=0.1)
    assert (
        "its rank slept 20 ms a forward and 40 ms a backward"
        in run.data.tags["mlflow.note.content"]
    )
    assert_registered(run)
    client = MlflowClient(uri)
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {
        "pipeline_gantt.png",
        "timeline.png",
        "timeline.trace.json",
        "pipeline_steps.txt",
    } <= artifacts
    trace = json.loads(
        Path(client.download_artifacts(run.info.run_id, "timeline.trace.json")).read_text()
    )
    ranks_with_forward = {e["tid"] for e in trace["traceEvents"] if e.get("cat") == "forward"}
    assert ranks_with_forward == {0, 1, 2, 3}
    table = run.data.tags["mlflow.note.content"]
    assert "11 time steps" in table and "2(m + p - 1) = 14" in table
    for rank in range(4):  # every rank ran 4 forwards and 4 backwards in the step shown
        line = next(row for row in table.splitlines() if row.startswith(f"rank {rank}:"))
        assert sorted(a.split("@")[0] for a in line.split(": ")[1].split()) == [
            *(f"B{j}" for j in range(4)),
            *(f"F{j}" for j in range(4)),
        ]
