"""Parameter counts from a model config, without building anything (used before launch).

The tests check each formula against the module really built (on the meta device for GPT-3).
"""

from collections.abc import Mapping
from typing import Any


def decoder_params(cfg: Mapping[str, Any]) -> dict[str, int]:
    d, layers, vocab = cfg["d_model"], cfg["n_layers"], cfg["vocab_size"]
    attention = 4 * (d * d + d)  # Q, K, V, output projections with biases
    ffn = 2 * 4 * d * d + 4 * d + d  # up (d -> 4d) and down (4d -> d) with biases
    norm = 2 * 2 * d  # two LayerNorms, weight and bias
    return {
        "embedding": vocab * d,  # tied: the output layer reuses it
        "attention": layers * attention,
        "ffn": layers * ffn,
        "norm": layers * norm,
    }


def ffnn_params(cfg: Mapping[str, Any]) -> int:
    widths = [cfg["in_features"], *cfg["hidden"], cfg["out_features"]]
    return sum(n_in * n_out + n_out for n_in, n_out in zip(widths[:-1], widths[1:], strict=True))


def pipeline_layers(cfg: Mapping[str, Any]) -> int:
    """How many layers a pipeline can split the model into: blocks, or Linear layers."""
    if cfg.get("_target_") == "runner.models.decoder.Decoder":
        return cfg["n_layers"]
    if cfg.get("_target_") == "runner.models.ffnn.FFNN":
        return len(cfg["hidden"]) + 1
    return 1  # a neuron, or a model the runner cannot split


def balanced_split(layers: int, stages: int) -> list[int]:
    """Layers per stage, as even as can be, the larger shares first."""
    share, extra = divmod(layers, stages)
    return [share + (s < extra) for s in range(stages)]


def neuron_params(cfg: Mapping[str, Any]) -> int:
    return cfg["n_inputs"] + 1  # one weight per input and the bias weight


def param_count(model_cfg: Mapping[str, Any]) -> int | None:
    """Trainable parameters of a config whose `_target_` is one of ours; None for any other."""
    count = COUNTERS.get(model_cfg.get("_target_", ""))
    if count is None:
        return None
    total = count(model_cfg)
    return sum(total.values()) if isinstance(total, dict) else total


COUNTERS = {
    "runner.models.neuron.Neuron": neuron_params,
    "runner.models.ffnn.FFNN": ffnn_params,
    "runner.models.decoder.Decoder": decoder_params,
}


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


def column_row_pairs(layers: range) -> list[tuple[int, int]]:
    """The FFNN's Linear layers that tensor parallelism splits as a pair inside one stage: the first
    by columns, the second by rows (Megatron's MLP); an odd last layer stays whole."""
    return [(i, i + 1) for i in range(layers.start, layers.stop - 1, 2)]
