"""Every option of every config group composes, resolves and validates; overrides reach fields."""

import pytest
import torch
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from runner import choices, losses, optimizers, validate
from runner.config_dirs import CONF_DIR, EXPERIMENTS_DIR
from runner.layouts.pipeline import stages
from runner.models import activations
from runner.modes import example as worked_examples
from tests.helpers.jobs import compose_job

# A model whose data the option fits, for groups where the default model would not.
DATA_MODEL = {"digits": "ffnn", "breast_cancer": "neuron", "text": "decoder"}
LAYOUT_MODEL = {"ep": "moe", "moe_3d": "moe"}  # layouts of a model with experts


def options(group: str) -> list[str]:
    folder = EXPERIMENTS_DIR if group == "experiment" else CONF_DIR / group
    return sorted(p.stem for p in folder.glob("*.yaml"))


GROUPS = ["model", "data", "parallel", "hardware", "trainer", "logger", "experiment"]
CASES = [(group, option) for group in GROUPS for option in options(group)]


def test_every_group_has_options() -> None:
    assert all(options(group) for group in GROUPS)


@pytest.mark.parametrize(("group", "option"), CASES, ids=[f"{g}={o}" for g, o in CASES])
def test_option_composes_and_validates(group: str, option: str) -> None:
    overrides = [f"+{group}={option}" if group == "experiment" else f"{group}={option}"]
    if group == "data":
        overrides.append(f"model={DATA_MODEL[option]}")
    if group == "parallel" and option in LAYOUT_MODEL:
        overrides.append(f"model={LAYOUT_MODEL[option]}")
    cfg, choices = compose_job(*overrides)
    assert choices[group] == option
    OmegaConf.to_container(cfg, resolve=True)  # every interpolation resolves
    # too large to train: refused, by name
    refused_here = dict.fromkeys(("gpt3_175b", "llama3_405b", "mixtral_8x7b"), "model")
    # A plan prices GPUs it does not need (plan_gpt3); training needs them here
    if cfg.hardware.accelerator == "gpu" and cfg.mode == "train" and not torch.cuda.is_available():
        refused_here[option] = "hardware.accelerator"
    if option in refused_here:
        with pytest.raises(validate.ConfigError) as refused:
            validate.validate(cfg)
        assert refused.value.key == refused_here[option]
    else:
        validate.validate(cfg)


@pytest.mark.parametrize(
    ("model", "data", "n_in"), [("neuron", "breast_cancer", 30), ("ffnn", "digits", 64)]
)
def test_each_model_picks_its_data(model: str, data: str, n_in: int) -> None:
    cfg, choices = compose_job(f"model={model}")
    assert choices["data"] == data
    assert cfg.data.n_features == n_in


def test_decoder_takes_vocab_and_context_from_its_data() -> None:
    cfg, choices = compose_job("model.context_len=32", "data.vocab_size=512")
    assert choices["data"] == "text"
    assert (cfg.model.vocab_size, cfg.data.seq_len) == (512, 32)


def test_data_choice_overrides_the_models_default() -> None:
    cfg, choices = compose_job("model=ffnn", "data=breast_cancer")
    assert choices["data"] == "breast_cancer"
    assert (cfg.model.in_features, cfg.model.out_features) == (30, 1)


def test_overrides_reach_any_field() -> None:
    cfg, _ = compose_job("model.n_layers=4", "trainer.max_steps=50", "seed=7")
    assert (cfg.model.n_layers, cfg.trainer.max_steps, cfg.seed) == (4, 50, 7)


def test_gpt3_preset_is_the_seeds_model() -> None:
    cfg, _ = compose_job("model=gpt3_175b")
    m = cfg.model
    assert (m.n_layers, m.d_model, m.n_heads, m.context_len, m.vocab_size) == (
        96,
        12288,
        96,
        2048,
        50000,
    )


def test_tracking_uri_defaults_to_sqlite_and_follows_the_environment(monkeypatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert compose_job()[0].logger.tracking_uri == "sqlite:///mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5999")
    assert compose_job()[0].logger.tracking_uri == "http://127.0.0.1:5999"


@pytest.mark.parametrize("override", ["model.n_layers=abc", "model.nope=1", "trainer.lr=fast"])
def test_schema_refuses_wrong_types_and_unknown_keys(override: str) -> None:
    with pytest.raises(ConfigCompositionException):
        compose_job(override)


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["model.d_model=100", "model.n_heads=3"], "model.d_model"),
        (["data.batch_size=0"], "data.batch_size"),
        (["trainer.optimizer=rmsprop"], "trainer.optimizer"),
        (["trainer.warmup_steps=-1"], "trainer.warmup_steps"),
        (["model=ffnn", "model.hidden=[8,0]"], "model.hidden[1]"),
        (["model=neuron", "model.activation=relu"], "data.loss"),
        (["data.seq_len=128"], "data.seq_len"),
        (["parallel.dp=1", "hardware.devices=2"], "parallel"),  # a mesh of 1 x 1 x 1: 1 process
        (["mode=example"], "example"),
        (["data.vocab_size=100"], "data.vocab_size"),
        (["model.vocab_size=999"], "model.vocab_size"),
        (["model=ffnn", "model.out_features=3"], "model.out_features"),
        (["model=neuron", "data=digits"], "data.n_outputs"),
        (["trainer.weight_decay=-0.1"], "trainer.weight_decay"),
        (["parallel=data", "hardware.devices=3"], "data.batch_size"),
        (["parallel=data", "hardware.nodes=2"], "hardware.nodes"),
        (
            ["parallel=data", "hardware.devices=2", "fault.kill_rank=2", "fault.at_step=1"],
            "fault.kill_rank",
        ),
        (["parallel=data", "hardware.devices=2", "fault.hang_rank=0"], "fault.at_step"),
        (
            ["parallel=data", "hardware.devices=2", "fault.hang_rank=0", "fault.kill_rank=1"],
            "fault.hang_rank",
        ),
        (["dist.timeout_s=0"], "dist.timeout_s"),
        (["parallel.reshard_after_forward=sometimes"], "parallel.reshard_after_forward"),
        (
            ["parallel=fsdp", "hardware.devices=2", "parallel.param_gather=step"],
            "parallel.param_gather",
        ),
        (
            [
                "parallel=pipeline",
                "hardware.devices=2",
                "parallel.shard=full",
                "parallel.reshard_after_forward=always",
            ],
            "parallel.reshard_after_forward",
        ),
        (["fault.disk_full_at_step=7", "checkpoint.every_n_steps=5"], "fault.disk_full_at_step"),
    ],
)
def test_semantic_errors_name_the_key(overrides: list[str], key: str) -> None:
    cfg, _ = compose_job(*overrides)
    with pytest.raises(validate.ConfigError) as error:
        validate.validate(cfg)
    assert error.value.key == key


def test_names_the_validator_allows_are_the_ones_that_exist() -> None:
    assert set(choices.ACTIVATIONS) == set(activations.ACTIVATIONS)
    assert set(choices.LOSSES) == set(losses.LOSSES)
    assert set(choices.OPTIMIZERS) == set(optimizers.OPTIMIZERS)
    assert set(choices.EXAMPLES) == set(worked_examples.EXAMPLES)
    assert set(choices.SCHEDULES) == set(stages.SCHEDULES)


@pytest.mark.parametrize(
    ("overrides", "microbatches"),
    [
        (["parallel.pp=2"], 2),
        (["parallel.pp=4", "model.n_layers=4"], 4),
        ([], 1),
        (["parallel=dp_pp"], 4),
    ],
)
def test_micro_batches_follow_the_pipeline_unless_given(
    overrides: list[str], microbatches: int
) -> None:
    """The default 1F1B needs a micro-batch per stage: `parallel.pp=2` alone is not refused."""
    cfg, _ = compose_job(*overrides)
    validate.validate(cfg)
    assert cfg.parallel.microbatches == microbatches


def test_replicas_fill_the_devices_no_layout_takes() -> None:
    """A cluster profile plans without a layout: its 128 devices are data-parallel replicas."""
    cfg, _ = compose_job("mode=plan", "model=gpt3_175b", "hardware=h100_cluster",
                         "parallel.tp=8", "parallel.pp=4")  # fmt: skip
    assert tuple(validate.resolve_mesh(cfg).shape) == (4, 4, 1, 8)  # pp, dp, cp, tp
