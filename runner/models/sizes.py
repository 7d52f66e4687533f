"""What any model's spec answers, asked for a config: its layers and its pipeline stages.

Torch-free (used before launch). The tests check each spec's formulas against the module built.
"""

from collections.abc import Mapping
from typing import Any

from runner.models.registry import spec_for


def pipeline_layers(model_cfg: Mapping[str, Any]) -> int:
    """How many layers a pipeline can split the model into (1: a model it cannot split)."""
    spec = spec_for(model_cfg)
    return 1 if spec is None else spec.layers(model_cfg)


def balanced_split(layers: int, stages: int) -> list[int]:
    """Layers per stage, as even as can be, the larger shares first."""
    share, extra = divmod(layers, stages)
    return [share + (s < extra) for s in range(stages)]


def stage_layers(model_cfg: Mapping[str, Any], parallel_cfg: Mapping[str, Any]) -> list[range]:
    """The layers of each pipeline stage (one stage when there is no pipeline)."""
    layers = pipeline_layers(model_cfg)
    if parallel_cfg["pp"] == 1:  # no pipeline: virtual stages and a split mean nothing
        return [range(layers)]
    stages = parallel_cfg["pp"] * parallel_cfg["virtual_stages"]
    split = parallel_cfg["split"]
    split = list(split) if split else balanced_split(layers, stages)
    ends = [sum(split[: s + 1]) for s in range(len(split))]
    return [range(end - n, end) for end, n in zip(ends, split, strict=True)]
