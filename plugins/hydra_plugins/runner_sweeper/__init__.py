"""Hydra's basic sweeper, composing each group choice once: a sweep of many layouts of one job
(mode=plan over tp, pp, dp and micro-batches) spends its time planning, not composing.

Hydra composes a job's config twice, once to check the batch and once to launch it, each from
the YAML files, the schemas and the defaults lists (about 0.1 s here, most of a planned job's
time). Overrides that choose a config group's option (`model=ffnn`, `parallel=data`) change what
is composed; plain values (`parallel.tp=4`, `+x=1`) are applied to the composed config
afterwards, as Hydra applies them itself. So jobs that share their group choices share one
composition, a copy of which each job's values are applied to: the same config Hydra composes
(tests/test_sweeper.py compares them). The sweeper is the basic one otherwise: same batches, same
launcher, same callbacks. Selected in conf/config.yaml (`override hydra/sweeper: runner`).
"""

# No `from __future__ import annotations`: Hydra runs this module without registering it, and
# dataclasses then cannot resolve string annotations.
import copy
from dataclasses import dataclass
from typing import Any

from hydra._internal.config_loader_impl import ConfigLoaderImpl, get_overrides_dirname
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper, BasicSweeperConf
from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, OverrideType
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict


@dataclass
class RunnerSweeperConf(BasicSweeperConf):
    _target_: str = "hydra_plugins.runner_sweeper.RunnerSweeper"


ConfigStore.instance().store(group="hydra/sweeper", name="runner", node=RunnerSweeperConf)


class ComposedOnce:
    """A config loader whose sweep configs reuse one composition per set of group choices; every
    other call goes to Hydra's own loader."""

    def __init__(self, loader: ConfigLoaderImpl) -> None:
        self.loader = loader
        self.parser = OverridesParser.create()
        self.composed: dict[tuple[str, ...], DictConfig] = {}

    def __getattr__(self, name: str) -> Any:
        # Only once built: unpickling (the submitit launcher ships the loader to the cluster's
        # jobs) asks for attributes before `loader` is there, which would recurse.
        loader = self.__dict__.get("loader")
        if loader is None:
            raise AttributeError(name)
        return getattr(loader, name)

    def is_value(self, override: Override) -> bool:
        """A plain value for the composed config: not a group choice, a deletion or Hydra's."""
        return (
            override.type in (OverrideType.CHANGE, OverrideType.ADD, OverrideType.FORCE_ADD)
            and not override.is_hydra_override()
            and not override.is_sweep_override()
            and not self.loader.repository.group_exists(override.key_or_group)
        )

    def load_sweep_config(self, master_config: DictConfig, sweep_overrides: list[str]) -> Any:
        parsed = self.parser.parse_overrides(overrides=list(sweep_overrides))
        values = [o for o in parsed if self.is_value(o)]
        choices = tuple(o.input_line for o in parsed if not self.is_value(o))
        if choices not in self.composed:
            self.composed[choices] = self.loader.load_sweep_config(master_config, list(choices))
        cfg = copy.deepcopy(self.composed[choices])
        ConfigLoaderImpl._apply_overrides_to_config(values, cfg)
        task = [o for o in parsed if not o.is_hydra_override()]
        job = cfg.hydra.job.config.override_dirname
        with open_dict(cfg.hydra):  # as Hydra writes them: every override, in the order given
            cfg.hydra.overrides.task = [o.input_line for o in task]
            cfg.hydra.job.override_dirname = get_overrides_dirname(
                overrides=task,
                kv_sep=job.kv_sep,
                item_sep=job.item_sep,
                exclude_keys=job.exclude_keys,
            )
        OmegaConf.copy_cache(from_config=master_config, to_config=cfg)
        return cfg


class RunnerSweeper(BasicSweeper):
    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        loader = ComposedOnce(hydra_context.config_loader)
        cached = HydraContext(config_loader=loader, callbacks=hydra_context.callbacks)
        super().setup(hydra_context=cached, task_function=task_function, config=config)
