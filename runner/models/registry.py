"""The one list of models. Everything else asks a model's spec (runner/models/spec.py) for what it
needs: validation, the planner, the pipeline and tensor-parallel layouts, mode=plan.

Adding a model: a folder runner/models/<name>/ (model.py, config.py, spec.py), one line here, and
conf/model/<name>.yaml (docs/extending.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from runner.models.decoder.spec import SPEC as DECODER
from runner.models.ffnn.spec import SPEC as FFNN
from runner.models.neuron.spec import SPEC as NEURON
from runner.models.spec import ModelSpec

SPECS: dict[str, ModelSpec] = {spec.name: spec for spec in (NEURON, FFNN, DECODER)}


def spec_for(model_cfg: Mapping[str, Any]) -> ModelSpec | None:
    """The spec of a config's model, by its `_target_`; None for a model of the user's."""
    target = model_cfg.get("_target_", "")
    return next((spec for spec in SPECS.values() if spec.target == target), None)
