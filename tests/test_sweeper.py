"""The sweeper that composes each set of group choices once (plugins/hydra_plugins/runner_sweeper)
hands every job the config Hydra itself composes for it."""

import pytest
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.types import RunMode
from hydra_plugins.runner_sweeper import ComposedOnce
from omegaconf import OmegaConf

from runner.config import register_configs
from runner.config_dirs import CONF_DIR

register_configs()  # the structured configs the YAML files name

JOBS = [
    ["mode=plan", "parallel.tp=2", "parallel.pp=4"],
    ["mode=plan", "parallel.tp=4", "parallel.pp=1"],  # the same choices: composed once
    ["model=ffnn", "parallel=data", "hardware.devices=2"],  # group choices
    ["parallel.tp=2", "model=ffnn", "parallel=data"],  # a value before the choices
    ["+extra=1", "parallel.microbatches=${parallel.pp}", "parallel.pp=2"],  # add, interpolation
    ["hardware=a100", "parallel.dp=null", "hardware.devices=4"],  # a profile and its values
]


@pytest.mark.parametrize("overrides", JOBS)
def test_each_job_gets_the_config_hydra_composes(overrides: list[str]) -> None:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        master = loader.load_configuration("config", ["mode=plan"], RunMode.MULTIRUN)
        once = ComposedOnce(loader)
        for _ in range(2):  # the second from the cache
            ours = once.load_sweep_config(master, overrides)
            assert OmegaConf.to_yaml(ours) == OmegaConf.to_yaml(
                loader.load_sweep_config(master, overrides)
            )
            assert ours.hydra.overrides.task == overrides


def test_jobs_that_share_their_group_choices_share_one_composition() -> None:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        master = loader.load_configuration("config", [], RunMode.MULTIRUN)
        once = ComposedOnce(loader)
        for tp in (1, 2, 4, 8):
            once.load_sweep_config(master, ["model=ffnn", f"parallel.tp={tp}"])
        once.load_sweep_config(master, ["model=decoder", "parallel.tp=2"])
        assert sorted(once.composed) == [("model=decoder",), ("model=ffnn",)]
