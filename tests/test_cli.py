"""The command line as users type it: the seed's examples, a sweep, and bad input."""

import csv
import itertools
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from matplotlib.image import imread
from mlflow import MlflowClient

from runner.config_dirs import CONF_DIR, EXPERIMENTS_DIR
from runner.metrics import (
    EXAMPLE_DLOSS_DYHAT,
    EXAMPLE_ERROR_TERM_A,
    EXAMPLE_ERROR_TERM_B,
    EXAMPLE_GRAD_W_A1,
    EXAMPLE_GRAD_W_B1,
    EXAMPLE_LOSS_AFTER,
    EXAMPLE_W_A1_NEW,
    EXAMPLE_W_B1_NEW,
    EXAMPLE_Y_HAT,
    EXAMPLE_Y_HAT_RELU,
    EXAMPLE_Y_HAT_SHIFTED,
    EXAMPLE_Z,
    EXAMPLE_Z_SHIFTED,
    THROUGHPUT,
    TRAIN_LOSS,
)
from tests.helpers.in_process import Cli
from tests.helpers.jobs import QUICK
from tests.helpers.metrics import assert_registered
from tests.helpers.records import all_runs

SEED_NEURON = {
    EXAMPLE_Z.name: 4.8,
    EXAMPLE_Y_HAT.name: 0.992,
    EXAMPLE_Z_SHIFTED.name: 0.5,
    EXAMPLE_Y_HAT_SHIFTED.name: 0.622,
    EXAMPLE_Y_HAT_RELU.name: 4.8,
}
SEED_BACKPROP = {
    EXAMPLE_Y_HAT.name: 1.7,
    "loss": 0.245,
    EXAMPLE_DLOSS_DYHAT.name: 0.7,
    EXAMPLE_ERROR_TERM_B.name: 0.7,
    EXAMPLE_ERROR_TERM_A.name: 0.28,
    EXAMPLE_GRAD_W_A1.name: 0.84,
    EXAMPLE_GRAD_W_B1.name: 2.1,
    EXAMPLE_W_A1_NEW.name: 0.058,
    EXAMPLE_W_B1_NEW.name: 0.295,
}


def runs_by_name(uri: str) -> dict:
    return {r.info.run_name: r for r in all_runs(uri)}


def assert_nothing_running(uri: str) -> None:
    assert [r.info.run_name for r in all_runs(uri) if r.info.status == "RUNNING"] == []


def test_the_seeds_worked_examples_as_a_sweep(tmp_path: Path, cli: Cli, seeded: str) -> None:
    done = cli("-m", "+experiment=seed_neuron,seed_backprop", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    uri = seeded
    runs = runs_by_name(uri)
    neuron, backprop = runs["seed_neuron none"], runs["seed_backprop none"]
    for run, expected in ((neuron, SEED_NEURON), (backprop, SEED_BACKPROP)):
        assert {k: round(run.data.metrics[k], 3) for k in expected} == expected
        assert run.data.tags["mode"] == "example"
        assert_registered(run)
    assert backprop.data.metrics[EXAMPLE_LOSS_AFTER.name] < backprop.data.metrics["loss"]
    assert (
        round(backprop.data.metrics[EXAMPLE_LOSS_AFTER.name], 3) == 0.007
    )  # the seed's second MSE


def test_the_run_mode_is_the_command_lines_and_no_config_sets_it(
    tmp_path: Path, cli: Cli, seeded: str
) -> None:
    """runner/compat/hydra_mode.py takes the mode from `-m` or a `hydra.mode=` override rather
    than composing the config once more to read it: the same answer while no config of the
    runner sets hydra.mode, and an override still makes a sweep."""
    configs = [*CONF_DIR.rglob("*.yaml"), *EXPERIMENTS_DIR.rglob("*.yaml")]
    assert len(configs) > 20
    setting = [p.name for p in configs if "mode" in ((yaml.safe_load(p.read_text()) or {}).get(
        "hydra") or {})]  # fmt: skip
    assert setting == []
    done = cli("hydra.mode=MULTIRUN", "+experiment=seed_neuron,seed_backprop", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    runs = all_runs(seeded)
    assert sorted(r.data.tags["mode"] for r in runs) == ["example", "example", "sweep"]


@pytest.mark.slow  # three jobs and their comparison: half a minute
def test_a_sweep_nests_one_child_run_per_job_under_a_parent(
    tmp_path: Path, cli: Cli, seeded: str
) -> None:
    done = cli("-m", "model=neuron,ffnn,decoder", "trainer.max_steps=8", *QUICK, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    for noise in ("Tip:", "GPU available", "LeafSpec", "`srun` command", "searchpath"):
        assert noise not in done.stdout + done.stderr, noise  # runner/quiet.py
    # Each run and the sweep end with their summary: status, figures, where, how to look.
    said = done.stderr.splitlines()
    assert sum(line.startswith("run ") and line.endswith(": FINISHED") for line in said) == 3
    assert sum(line.startswith("  final loss ") and "samples/s" in line for line in said) == 3
    assert any(line.startswith("sweep ") and line.endswith("3 jobs, 3 FINISHED") for line in said)
    assert said[-2] == "  see it: mlflow ui --backend-store-uri sqlite:///mlflow.db", said[-4:]
    assert said[-1].startswith("  then open http://127.0.0.1:5000/#/experiments/"), said[-4:]
    uri = seeded
    runs = all_runs(uri)
    (parent,) = [r for r in runs if r.data.tags.get("mode") == "sweep"]
    children = [r for r in runs if r is not parent]
    assert sorted(r.data.tags["model"] for r in children) == ["decoder", "ffnn", "neuron"]
    assert {r.data.tags["mlflow.parentRunId"] for r in children} == {parent.info.run_id}
    assert {r.info.status for r in runs} == {"FINISHED"}
    # MLflow 3's UI opens the experiment on its training runs, not on GenAI traces.
    experiment = MlflowClient(uri).get_experiment(parent.info.experiment_id)
    assert experiment.tags.get("mlflow.experimentKind") == "custom_model_development"
    assert all(
        len(MlflowClient(uri).get_metric_history(r.info.run_id, TRAIN_LOSS.name)) == 8
        for r in children
    )
    # The parent compares its jobs: a row per child with the child's own figures, and a chart.
    client = MlflowClient(uri)
    with open(client.download_artifacts(parent.info.run_id, "comparison.csv")) as f:
        table = {row["run"]: row for row in csv.DictReader(f)}
    assert sorted(table) == sorted(r.info.run_name for r in children)
    for child in children:
        row, history = (
            table[child.info.run_name],
            client.get_metric_history(child.info.run_id, TRAIN_LOSS.name),
        )
        assert row["status"] == "FINISHED"
        assert float(row["final train_loss"]) == max(history, key=lambda m: m.step).value
        assert float(row["samples/s"]) == child.data.metrics[THROUGHPUT.name]
    markdown = Path(client.download_artifacts(parent.info.run_id, "comparison.md")).read_text()
    assert markdown.startswith("| job | run | status | final train_loss | samples/s |")
    assert len(markdown.splitlines()) == 2 + len(children)
    picture = imread(client.download_artifacts(parent.info.run_id, "comparison.png"))
    assert picture.shape[0] > 300 and picture.shape[1] > 600


BAD = [
    (["model.n_layers=abc"], "model.n_layers"),
    (["model.nope=1"], "model.nope"),
    (["model=resnet"], "decoder, ffnn, gpt3_175b, llama3_405b, mixtral_8x7b, moe, neuron"),
    (["model.d_model=100", "model.n_heads=3"], "model.d_model"),
    (["model.n_kv_heads=3"], "model.n_kv_heads: must divide model.n_heads=4"),
    (["parallel=tensor", "hardware.devices=2", "model.n_kv_heads=1"], "1 key/value heads do no"),
    (["data.batch_size=-4"], "data.batch_size"),
    (["model=gpt3_175b"], "174.6 B parameters"),
    # Nothing listens on the discard port here: the job must not train unrecorded.
    (["logger.tracking_uri=http://127.0.0.1:9"], "no MLflow server answers"),
    (["parallel=dp_tp", "hardware.devices=2"], "dp x pp x tp = dp=2 x pp=1 x tp=2 = 4"),
    (["trainer.precision=fp4"], "32-true, bf16-mixed, 16-mixed, bf16-true, fp8"),
    (
        ["model=moe", "parallel=ep", "trainer.precision=bf16-true", "checkpoint.every_n_steps=5"],
        "checkpoint.every_n_steps: snapshots of experts sharded",
    ),
    (
        ["trainer.precision=bf16-true", "parallel=data", "hardware.devices=2"],
        "parallel.shard: none, but bf16-true's replicas (and their cp ranks) keep their fp32",
    ),
    (
        ["trainer.precision=fp8", "parallel=tensor", "hardware.devices=2"],
        "trainer.precision: fp8 with parallel.tp",
    ),
    (["trainer.grad_reduce=bf16"], "trainer.grad_reduce: bf16 sums 16-bit weights' gradients"),
    (["mode=search", "hardware=dgx_h100", "search.objective=fast"], "search.objective: 'fast'"),
    (["mode=search", "hardware=dgx_h100", "search.tp=[0]"], "search.tp: sizes must be positive"),
    (
        ["mode=search", "hardware=h100"],
        "hardware.devices: mode=search chooses the mesh over a node",
    ),
    (["trainer.precision=16-mixed"], "runs on GPUs only"),
    (["parallel=pipeline", "hardware.devices=2", "trainer.compile=true"], "trainer.compile"),
    (["parallel=fsdp", "hardware.devices=2", "parallel.shard=zero3"], "optimizer, gradients, full"),
    (["parallel=fsdp", "hardware.devices=2", "trainer.compile=true"], "trainer.compile"),
    (
        [
            "parallel=data",
            "hardware.devices=2",
            "parallel.shard=optimizer",
            "trainer.precision=16-mixed",
        ],
        "trainer.precision: 16-mixed scales the loss, and its scaler has not been run on FSDP",
    ),
    (["+foo=1"], "foo: no such key; the top-level keys are: model, data"),
    (["+trainer.lr_warmup=3"], "trainer.lr_warmup: no such key; trainer has: max_steps"),
    (["logger.tracking_uri=ftp://x"], "logger.tracking_uri: ftp://x: no MLflow store"),
    (["-m", "parallel.shard=none,full", "--cfg", "hydra"], "--cfg and --multirun: one at a time"),
    # A study names keys of the config and metrics of runner/metrics.py, checked before any job
    (["-m", "+experiment=bubble", "study.figures=[idle_fractoin]"], "study.figures: 'idle_fr"),
    (["-m", "+experiment=bubble", "study.x=parallel.microbatch"], "study.x: 'parallel.microb"),
    (["+experiment=bubble", "study.lines=[parallel.shedule]"], "study.lines: 'parallel.shed"),
    (["+experiment=bubble", "study.predicted.idle_fraction=pred/nope"], "study.predicted.idle_"),
    (["+experiment=bubble", "study.figures=[idle_fraction]"], "study.predicted: 'bubble_fraction"),
    (["+experiment=bubble", "+study.colour=red"], "study.colour"),
    (["-m", "+experiment=bubble", "study.ends=KILLED"], "study.ends: 'KILLED' is not one of: F"),
    # Sequence parallelism splits the decoder's sequence over the tensor-parallel ranks
    (["parallel.sequence_parallel=true"], "parallel.sequence_parallel: splits over the tensor-pa"),
    (
        ["model=ffnn", "parallel=tensor", "hardware.devices=2", "parallel.sequence_parallel=true"],
        "parallel.sequence_parallel: this model has no sequence to split",
    ),
    (["parallel=tp_sp", "hardware.devices=2", "data.seq_len=63"], "data.seq_len: 63 positions do"),
    (
        ["parallel=pp_tp", "parallel.schedule=zero_bubble", "parallel.virtual_stages=2"],
        "parallel.schedule: zero_bubble splits backward into input and weight passes",
    ),
    (["-m", "+experiment=bubble", "study.ends=FAILED"], "study.ends: FAILED needs a fault that "),
    # Context parallelism splits the decoder's sequence into 2 x cp chunks, over its own ranks
    (["model=ffnn", "parallel=cp", "hardware.devices=2"], "parallel.cp: this model has no sequenc"),
    (["parallel=cp", "hardware.devices=4", "data.seq_len=60"], "data.seq_len: 60 positions do not"),
    (
        ["parallel=cp", "parallel.cp=2", "parallel.tp=2", "hardware.devices=2"],
        "parallel: dp x pp x",
    ),
    (
        ["parallel=fsdp", "parallel.pp=2", "parallel.reshard_after_forward=always"],
        "parallel.reshard_after_forward: always frees the weights between",
    ),
    # Expert parallelism places a mixture of experts' experts over data-parallel ranks
    (["parallel=ep"], "parallel.ep: this model has no experts"),
    (["parallel=cp", "hardware.devices=2", "trainer.attention=math"], "trainer.attention: math wi"),
    (["trainer.attention=flash"], "trainer.attention: 'flash' is not one of: auto, math"),
    (["model=moe", "parallel=ep", "model.n_experts=3"], "model.n_experts: 3 experts do not split"),
    (["model=moe", "parallel=data", "hardware.devices=2", "parallel.ep=4"], "parallel.ep: its ran"),
    (["model=moe", "model.top_k=5"], "model.top_k: 5 experts a token of model.n_experts=4"),
    (["model=moe", "trainer.precision=16-mixed"], "trainer.precision: 16-mixed scales the loss, a"),
    (["hardware.emulated_linear_ms=0"], "hardware.emulated_linear_ms: must be positive or null"),
    (["-m", "+experiment=data_scaling", "study.crossover=idle"], "study.crossover: 'idle': one of"),
    (["hardware.figures=measured"], "hardware.figures: 'measured' is not one of: profile, host"),
    (["mode=plan", "hardware=h100", "hardware.figures=host"], "hardware.figures: host measures"),
]


@pytest.mark.parametrize(("overrides", "named"), BAD, ids=[" ".join(o) for o, _ in BAD])
def test_bad_input_fails_at_once_in_one_line(
    tmp_path: Path,
    cli: Callable[..., subprocess.CompletedProcess],
    overrides: list[str],
    named: str,
) -> None:
    done = cli(*overrides, cwd=tmp_path)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("error: ") and named in lines[0]
    assert "Traceback" not in done.stdout + done.stderr
    assert not (tmp_path / "mlflow.db").exists()  # no run was opened, so none is left RUNNING


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("study:\n  question: q\n bad: 1\n", "mine.yaml, line 4: not valid YAML"),
        ("study:\n  question: q\n  colour: red\n", "study.colour: Key 'colour' not in"),
    ],
    ids=["not YAML", "a key no study has"],
)
def test_a_users_broken_study_fails_in_one_line_naming_it(
    tmp_path: Path, cli: Callable[..., subprocess.CompletedProcess], text: str, named: str
) -> None:
    (tmp_path / "experiments").mkdir()
    (tmp_path / "experiments" / "mine.yaml").write_text(f"# @package _global_\n{text}")
    done = cli("-m", "+experiment=mine", cwd=tmp_path)
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("error: ") and named in line, line
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "multirun").exists()


@pytest.mark.parametrize(("value", "traced"), [("0", False), ("1", True)])
def test_hydra_full_error_is_read_as_hydra_reads_it(
    tmp_path: Path, value: str, traced: bool
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "runner", "model.n_layers=abc"],
        cwd=tmp_path,
        env=os.environ | {"HYDRA_FULL_ERROR": value},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0 and ("Traceback" in done.stderr) == traced, done.stderr


@pytest.mark.slow
def test_a_sweep_with_a_bad_job_leaves_no_run_running(
    tmp_path: Path, cli: Cli, seeded: str
) -> None:
    done = cli(
        "-m", "model=neuron", "data.batch_size=16,0", "trainer.max_steps=4", *QUICK, cwd=tmp_path
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == "error: data.batch_size: must be positive, got 0"
    uri = seeded
    statuses = {r.data.tags.get("mode"): r.info.status for r in all_runs(uri)}
    assert statuses == {"sweep": "FAILED", "train": "FINISHED"}
    assert_nothing_running(uri)


@pytest.mark.slow
def test_mlflow_telemetry_is_off_unless_the_user_turns_it_on() -> None:
    """In new processes, side by side (importing the runner is what sets it): the user's choice
    (unset, false) -> what MLflow reads."""
    check = "import runner; from mlflow.environment_variables import MLFLOW_DISABLE_TELEMETRY as T"
    expected = {None: "True", "false": "False"}
    started = {}
    for users_choice in expected:
        env = {k: v for k, v in os.environ.items() if k != "MLFLOW_DISABLE_TELEMETRY"}
        if users_choice is not None:
            env["MLFLOW_DISABLE_TELEMETRY"] = users_choice
        started[users_choice] = subprocess.Popen(
            [sys.executable, "-c", f"{check}; print(T.get())"],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
    read = {choice: job.communicate(timeout=120)[0].strip() for choice, job in started.items()}
    assert read == expected


def test_the_users_own_studies_and_options_come_before_the_runners(
    tmp_path: Path, cli: Callable[..., subprocess.CompletedProcess]
) -> None:
    """./experiments and ./conf where a command runs are on Hydra's search path ahead of the
    runner's experiments/ and conf/: a study of the user's is found by name, one named as the
    runner's replaces it there, and so does an option of a group; elsewhere the runner's hold."""
    studies, trainers = tmp_path / "experiments", tmp_path / "conf" / "trainer"
    studies.mkdir()
    trainers.mkdir(parents=True)
    (studies / "mine.yaml").write_text("# @package _global_\nseed: 7\n")
    (studies / "seed_neuron.yaml").write_text("# @package _global_\nseed: 8\n")
    trainer = (CONF_DIR / "trainer" / "default.yaml").read_text()
    (trainers / "default.yaml").write_text(re.sub(r"(?m)^lr: .*$", "lr: 0.125", trainer))

    def composed(cwd: Path, *args: str) -> dict:
        done = cli(*args, "--cfg", "job", cwd=cwd)
        assert done.returncode == 0, done.stderr
        return yaml.safe_load(done.stdout)

    assert composed(tmp_path, "+experiment=mine")["seed"] == 7
    assert composed(tmp_path, "+experiment=seed_neuron")["seed"] == 8
    assert composed(tmp_path)["trainer"]["lr"] == 0.125
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    packaged = composed(elsewhere, "+experiment=seed_neuron")
    assert packaged["mode"] == "example" and packaged["trainer"]["lr"] != 0.125


def test_help_lists_every_option_of_every_group_the_modes_and_examples(
    tmp_path: Path, cli: Callable[..., subprocess.CompletedProcess]
) -> None:
    done = cli("--help", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    for group in ("model", "data", "parallel", "hardware", "trainer", "logger"):
        first = next(i for i, ln in enumerate(lines) if ln.lstrip(" +").startswith(f"{group}: "))
        wrapped = itertools.takewhile(lambda line: line.startswith("    "), lines[first + 1 :])
        text = " ".join([lines[first], *wrapped])
        for option in sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml")):
            assert f" {option}" in text, (group, option, text)
    # The studies, each with the question its file asks, read from experiments/ as it is now
    first = next(i for i, line in enumerate(lines) if line.startswith("Studies "))
    listed = " ".join(
        line.strip() for line in itertools.takewhile(str.strip, lines[first + 1 :])
    )  # fmt: skip
    for path in sorted(EXPERIMENTS_DIR.glob("*.yaml")):
        asked = " ".join(yaml.safe_load(path.read_text())["study"]["question"].split())
        assert f"{path.stem}: {asked}" in listed, (path.stem, listed)
    assert all(mode in done.stdout for mode in ("train", "example", "plan", "calibrate", "report"))
    assert done.stdout.count("python -m runner ") >= 5 and "_schema" not in done.stdout
