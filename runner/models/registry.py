"""The one list of models. Everything else asks a model's spec (runner/models/spec.py) for what it
needs: validation, the planner, the pipeline and tensor-parallel layouts, mode=plan.

Adding a model (docs/extending.md): a folder runner/models/<name>/ with model.py, config.py and
spec.py (which defines SPEC), its name in MODELS, and conf/model/<name>.yaml.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from runner.models.spec import ModelSpec

MODELS = ("neuron", "ffnn", "decoder", "moe")

SPECS: dict[str, ModelSpec] = {
    name: importlib.import_module(f"runner.models.{name}.spec").SPEC for name in MODELS
}


def spec_for(model_cfg: Mapping[str, Any]) -> ModelSpec | None:
    """The spec of a config's model, by its `_target_`; None for a model of the user's."""
    target = model_cfg.get("_target_", "")
    return next((spec for spec in SPECS.values() if spec.target == target), None)
