"""Short trainings of each model, recorded in MLflow and read back with MlflowClient."""

import json
import math
import os
import signal
import subprocess
from pathlib import Path
from statistics import fmean

import pytest
import yaml
from mlflow import MlflowClient

from runner.app import run_job
from runner.metrics import (
    COMPUTE_TIME,
    IDLE_FRACTION,
    STEP_TIME,
    SYSTEM_METRIC,
    THROUGHPUT,
    TOKEN_THROUGHPUT,
    VAL_LOSS,
)
from runner.training.module import TrainModule
from runner.training.rank import sigterm_deferred
from tests.helpers.jobs import QUICK, REPOSITORY, compose_job, train
from tests.helpers.metrics import assert_registered
from tests.helpers.records import all_runs, loss_series

STEPS = {"neuron": 40, "ffnn": 40, "decoder": 30}
# The loss of a guess that knows nothing: uniform over 2 classes, 10 digits, 2,048 tokens.
CHANCE = {"neuron": math.log(2), "ffnn": math.log(10), "decoder": math.log(2048)}


@pytest.mark.slow
@pytest.mark.parametrize("model", list(STEPS))
def test_loss_falls_and_the_run_is_recorded(store: str, model: str) -> None:
    overrides = [f"model={model}", f"trainer.max_steps={STEPS[model]}"]
    run_id = train(*overrides)
    run = MlflowClient(store).get_run(run_id)
    losses = loss_series(store, run_id)
    assert len(losses) == STEPS[model]
    assert fmean(losses[-5:]) < min(fmean(losses[:5]), CHANCE[model]) - 0.1
    assert run.info.status == "FINISHED"
    assert {
        k: run.data.tags[k] for k in ("model", "parallel", "hardware", "world_size", "mode")
    } == {
        "model": model,
        "parallel": "none",
        "hardware": "cpu",
        "world_size": "1",
        "mode": "train",
    }
    assert run.info.run_name.startswith(f"{model} none")
    assert f"trainer.max_steps={STEPS[model]}" in run.info.run_name
    assert run.data.params["trainer.max_steps"] == str(STEPS[model])
    assert VAL_LOSS.name in run.data.metrics
    assert run.data.metrics[STEP_TIME.name] > 0
    # From the loop's whole interval (data loading, logging): never more than the step allows.
    step_bound = int(run.data.params["data.batch_size"]) / run.data.metrics[STEP_TIME.name]
    assert 0 < run.data.metrics[THROUGHPUT.name] <= step_bound
    assert (TOKEN_THROUGHPUT.name in run.data.metrics) == (model == "decoder")
    assert_registered(run)


def test_artifacts_hold_the_resolved_config_and_the_overrides(store: str) -> None:
    run_id = train("model=ffnn", "trainer.max_steps=12")
    client = MlflowClient(store)
    config, overrides = (
        yaml.safe_load(Path(client.download_artifacts(run_id, name)).read_text())
        for name in ("config.yaml", "overrides.yaml")
    )
    assert config["model"]["in_features"] == 64  # resolved, not ${data.n_features}
    assert overrides == ["model=ffnn", "trainer.max_steps=12"]


def test_a_run_names_its_source_and_commit_and_describes_its_job(store: str) -> None:
    """MLflow's UI fills a run's Source and Description from MLflow's own tags."""
    tags = MlflowClient(store).get_run(train("model=ffnn", "trainer.max_steps=2")).data.tags
    assert tags["mlflow.source.name"] == "python -m runner"
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPOSITORY, capture_output=True,
                          text=True)  # fmt: skip
    if head.returncode == 0:  # a checkout; an installed wheel has no commit to name
        assert tags["mlflow.source.git.commit"] == head.stdout.strip()
    assert tags["mlflow.note.content"] == "ffnn on digits, layout none (1 process), hardware cpu"


def test_a_run_records_its_data_set_as_an_input_that_tells_other_data_apart(store: str) -> None:
    """MLflow's Datasets section: the data set's name, digest and rows; another data set, or the
    same one split otherwise, has another digest."""
    client = MlflowClient(store)

    def data_input(*overrides: str):
        (data,) = client.get_run(train(*overrides, "trainer.max_steps=1")).inputs.dataset_inputs
        return data

    digits = data_input("model=ffnn")
    assert (digits.dataset.name, json.loads(digits.dataset.profile)) == (
        "digits",
        {"num_rows": 1438, "val_rows": 359},
    )
    assert {(t.key, t.value) for t in digits.tags} == {("mlflow.data.context", "train")}
    again = data_input("model=ffnn", "seed=1")
    other_split = data_input("model=ffnn", "data.val_fraction=0.25")
    cancer = data_input("model=neuron")
    assert again.dataset.digest == digits.dataset.digest
    assert len({digits.dataset.digest, other_split.dataset.digest, cancer.dataset.digest}) == 3
    assert cancer.dataset.name == "breast_cancer"


@pytest.mark.slow
def test_the_same_seed_gives_the_same_loss_series(store: str) -> None:
    first, again, other = (
        train("model=ffnn", "trainer.max_steps=15", f"seed={s}") for s in (3, 3, 4)
    )
    assert loss_series(store, first) == loss_series(store, again)
    assert loss_series(store, first) != loss_series(store, other)


def test_a_failure_mid_run_marks_it_failed_and_keeps_what_was_logged(store, monkeypatch) -> None:
    step = TrainModule.training_step

    def crash_at_step_5(self, batch, index):
        if self.global_step == 5:
            raise RuntimeError("injected")
        return step(self, batch, index)

    monkeypatch.setattr(TrainModule, "training_step", crash_at_step_5)
    cfg, choices = compose_job(*QUICK, "model=ffnn", "trainer.max_steps=20")
    with pytest.raises(RuntimeError, match="injected"):
        run_job(cfg, choices, [])
    (run,) = all_runs(store)
    assert run.info.status == "FAILED"
    assert len(loss_series(store, run.info.run_id)) == 5
    assert_registered(run)  # the lost work's figures among them


def test_mlflow_samples_the_node_while_it_trains_unless_told_not_to(store: str) -> None:
    """MLflow's system metrics, even of a run shorter than their interval (10 s): its last part
    is logged too."""
    client = MlflowClient(store)
    sampled = client.get_run(train("model=ffnn", "trainer.max_steps=2")).data.metrics
    assert 0 <= sampled[SYSTEM_METRIC.at(system="cpu_utilization_percentage")] <= 100
    assert sampled[SYSTEM_METRIC.at(system="system_memory_usage_megabytes")] > 0
    off = train("model=ffnn", "trainer.max_steps=2", "logger.system_metrics=false")
    assert not [k for k in client.get_run(off).data.metrics if k.startswith("system/")]


def test_without_measuring_a_run_logs_its_losses_and_throughput_only(store: str) -> None:
    run_id = train("model=ffnn", "trainer.max_steps=12", "trainer.measure=false")
    client = MlflowClient(store)
    metrics = client.get_run(run_id).data.metrics
    assert len(loss_series(store, run_id)) == 12 and metrics[THROUGHPUT.name] > 0
    assert not {STEP_TIME.name, COMPUTE_TIME.name, IDLE_FRACTION.name} & set(metrics)
    assert "timeline.png" not in {a.path for a in client.list_artifacts(run_id)}


def test_a_run_shorter_than_its_warm_up_trains_and_says_what_it_leaves_out(
    store: str, capsys: pytest.CaptureFixture[str]
) -> None:
    run_id = train("model=ffnn", "trainer.max_steps=3", "trainer.warmup_steps=5")
    client = MlflowClient(store)
    metrics = client.get_run(run_id).data.metrics
    assert len(loss_series(store, run_id)) == 3 and client.get_run(run_id).info.status == "FINISHED"
    assert not {STEP_TIME.name, THROUGHPUT.name, IDLE_FRACTION.name} & set(metrics)
    assert "timeline.png" not in {a.path for a in client.list_artifacts(run_id)}
    said = [line for line in capsys.readouterr().err.splitlines() if "warm-up" in line]
    assert said == [
        "note: all 3 steps were warm-up (trainer.warmup_steps=5): step time, throughput, idle, "
        "MFU and the timeline are left out"
    ]


def test_a_sigterm_while_losses_are_written_is_handled_after_the_write() -> None:
    # A handler that raises inside a database transaction (Lightning's, torchrun's exit) would
    # lose every loss of the batch being written.
    events: list[str] = []

    def terminate(*_: object) -> None:
        events.append("handled")
        raise SystemExit("terminated")

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        with pytest.raises(SystemExit), sigterm_deferred():
            # Delivered before kill returns (POSIX); a handler would run as it returns.
            os.kill(os.getpid(), signal.SIGTERM)
            events.append("written")
        assert events == ["written", "handled"]
    finally:
        signal.signal(signal.SIGTERM, previous)
