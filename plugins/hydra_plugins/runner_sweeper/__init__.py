"""Hydra's basic sweeper, composing each group choice once: a sweep of many layouts of one job
(mode=plan over tp, pp, dp and micro-batches) spends its time planning, not composing.

Hydra composes a job's config twice, once to check the batch and once to launch it, each from
the YAML files, the schemas and the defaults lists (about 0.1 s here, most of a planned job's
time). Overrides that choose a config group's option (`model=ffnn`, `parallel=data`) change what
is composed; plain values (`parallel.tp=4`, `+x=1`) are applied to the composed config
afterwards, as Hydra applies them itself. So jobs that share their group choices share one
composition, a copy of which each job's values are applied to: the same config Hydra composes
(tests/test_sweeper.py compares them). Hydra checks a batch by composing each of its jobs before
launching any, then the launcher composes each again: the sweeper keeps the configs its check made
and hands each to the launcher once, so that a job's config is copied once, not twice. The sweeper
is the basic one otherwise: same batches, same launcher, same callbacks. Selected in
conf/config.yaml (`override hydra/sweeper: runner`).
"""

# No `from __future__ import annotations`: Hydra runs this module without registering it, and
# dataclasses then cannot resolve string annotations.
import copy
import pickle
from collections.abc import Sequence
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

CHECKED_KEPT = 256  # a batch's checked configs kept for its launcher (beyond: composed again)


class ComposedOnce:
    """A config loader whose sweep configs reuse one composition per set of group choices; every
    other call goes to Hydra's own loader."""

    def __init__(self, loader: ConfigLoaderImpl) -> None:
        self.loader = loader
        self.parser = OverridesParser.create()
        self.composed: dict[tuple[str, ...], DictConfig] = {}
        # A batch's configs as its check made them, each for the launcher to take once
        self.checked: dict[tuple[str, ...], tuple[DictConfig, DictConfig]] = {}

    def __getstate__(self) -> dict[str, Any]:
        # A launcher that ships the loader to its jobs (submitit) ships no batch's configs
        return {**self.__dict__, "checked": {}}

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

    def check(self, master_config: DictConfig, sweep_overrides: list[str]) -> None:
        """Compose a job's config to check it (Hydra's validate_batch_is_legal), and keep it for
        the launcher: up to CHECKED_KEPT of them (a batch may hold a long sweep's every job)."""
        cfg = self.load_sweep_config(master_config, sweep_overrides)
        if len(self.checked) < CHECKED_KEPT:
            self.checked[tuple(sweep_overrides)] = (master_config, cfg)

    def load_sweep_config(self, master_config: DictConfig, sweep_overrides: list[str]) -> Any:
        master, cfg = self.checked.pop(tuple(sweep_overrides), (None, None))
        if master is master_config:  # checked and not yet launched: the same config
            return cfg
        parsed = self.parser.parse_overrides(overrides=list(sweep_overrides))
        values = [o for o in parsed if self.is_value(o)]
        choices = tuple(o.input_line for o in parsed if not self.is_value(o))
        if choices not in self.composed:
            self.composed[choices] = self.loader.load_sweep_config(master_config, list(choices))
        cfg = copied(self.composed[choices])
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


def copied(cfg: DictConfig) -> DictConfig:
    """A deep copy of a composed config, through pickle: the same nodes, flags and types
    (tests/test_sweeper.py compares them), in half of copy.deepcopy's time (OmegaConf copies
    node by node in Python; pickle's loops are C's). A schema pickle cannot name (a class made
    in a function) is copied as before."""
    try:
        return pickle.loads(pickle.dumps(cfg, protocol=pickle.HIGHEST_PROTOCOL))
    except (pickle.PicklingError, AttributeError, TypeError):
        return copy.deepcopy(cfg)


class RunnerSweeper(BasicSweeper):
    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        self.loader = ComposedOnce(hydra_context.config_loader)
        cached = HydraContext(config_loader=self.loader, callbacks=hydra_context.callbacks)
        super().setup(hydra_context=cached, task_function=task_function, config=config)

    def validate_batch_is_legal(self, batch: Sequence[Sequence[str]]) -> None:
        """Hydra's check (every job of the batch composes), its configs kept for the launcher."""
        assert self.config is not None
        for overrides in batch:
            self.loader.check(self.config, list(overrides))
