"""Dataclass schemas of every config group, one module a group with the rules of that group beside
it, registered with Hydra's ConfigStore. A model's schema lives in its folder (runner/models/).

Each YAML option names its schema first in its defaults list, so a wrong type or an unknown key
fails at composition time, before anything is imported or launched. Nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from runner.config.data import DataConfig, TextDataConfig
from runner.config.example import ExampleConfig
from runner.config.faults import CheckpointConfig, DistConfig, FaultConfig
from runner.config.hardware import HardwareConfig, LinkConfig
from runner.config.logger import LoggerConfig
from runner.config.parallel import ParallelConfig
from runner.config.plan import PlanConfig, ReportConfig
from runner.config.search import SearchConfig
from runner.config.study import StudyConfig
from runner.config.trainer import TrainerConfig
from runner.errors import require
from runner.models.registry import SPECS

__all__ = ["Config", "HardwareConfig", "LinkConfig", "ParallelConfig", "PlanConfig"]
__all__ += ["TrainerConfig"]
__all__ += ["register_configs"]


@dataclass
class Config:
    model: Any = MISSING
    data: Any = MISSING
    parallel: ParallelConfig = MISSING
    hardware: HardwareConfig = MISSING
    trainer: TrainerConfig = MISSING
    logger: LoggerConfig = MISSING
    seed: int = 0
    mode: str = "train"  # one of runner.choices.MODES
    example: ExampleConfig | None = None
    plan: PlanConfig = field(default_factory=PlanConfig)
    search: SearchConfig = field(default_factory=SearchConfig)
    report: ReportConfig = field(default_factory=ReportConfig)
    fault: FaultConfig = field(default_factory=FaultConfig)
    dist: DistConfig = field(default_factory=DistConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    resume: str | None = None  # auto (the newest complete snapshot) or a run id
    study: StudyConfig | None = None  # an experiments/ file's question and what answers it


SCHEMAS: dict[str, dict[str, type]] = {
    "model": {name: spec.config for name, spec in SPECS.items()},
    "data": {"tabular": DataConfig, "text": TextDataConfig},
    "parallel": {"parallel": ParallelConfig},
    "hardware": {"hardware": HardwareConfig},
    "trainer": {"trainer": TrainerConfig},
    "logger": {"logger": LoggerConfig},
}


def register_configs() -> None:
    """Store every schema as `<group>/<name>_schema`, and the root as `config_schema`."""
    cs = ConfigStore.instance()
    if "config_schema.yaml" in cs.repo:  # stored by an earlier command of this process: the
        return  # schemas are the code's, the same each time (each store costs 70 ms)
    cs.store(name="config_schema", node=Config)
    for group, schemas in SCHEMAS.items():
        for name, node in schemas.items():
            cs.store(group=group, name=f"{name}_schema", node=node)


def check_known_keys(node: DictConfig, prefix: str = "") -> None:
    """Every key is one of its schema's. Hydra adds any key given with `+` (`+foo=1`), even to a
    schema's node, where it would be ignored in silence."""
    schema = OmegaConf.get_type(node)
    if is_dataclass(schema):
        known = [f.name for f in fields(schema)]
        extra = [k for k in node if k not in known]
        where = f"{prefix.rstrip('.')} has" if prefix else "the top-level keys are"
        require(not extra, f"{prefix}{extra[0] if extra else ''}", f"no such key; {where}: "
                + ", ".join(known))  # fmt: skip
    for key in node:
        child = node._get_node(key)
        if isinstance(child, DictConfig) and not child._is_none():
            check_known_keys(child, f"{prefix}{key}.")
