"""The FFNN, as the runner sees it: Linear layers of the given widths. A pipeline splits it by
layers; tensor parallelism splits consecutive layers of a stage as column/row pairs (Megatron's
MLP), an odd last layer whole."""

from __future__ import annotations

from typing import Any

from runner.choices import ACTIVATIONS
from runner.errors import one_of, positive, require
from runner.models.ffnn.config import FFNNConfig
from runner.models.spec import Activations, Cfg, Gemm, ModelSpec, matches_data


def widths(m: Cfg) -> list[int]:
    return [m["in_features"], *m["hidden"], m["out_features"]]


def column_row_pairs(layers: range) -> list[tuple[int, int]]:
    """The Linear layers split as a pair inside one stage: the first by columns, the second by
    rows; an odd last layer stays whole."""
    return [(i, i + 1) for i in range(layers.start, layers.stop - 1, 2)]


def linear_params(w: list[int], i: int) -> int:
    return w[i] * w[i + 1] + w[i + 1]


class FFNNSpec(ModelSpec):
    def check(self, m: Cfg, data: Cfg, train: bool) -> None:
        positive(m, "model", "in_features", "out_features")
        for i, width in enumerate(m["hidden"]):
            require(width > 0, f"model.hidden[{i}]", f"must be positive, got {width}")
        one_of(m["activation"], "model.activation", ACTIVATIONS)
        one_of(m["output_activation"], "model.output_activation", ACTIVATIONS)
        matches_data(m["in_features"], "model.in_features", data, "n_features", train)
        matches_data(m["out_features"], "model.out_features", data, "n_outputs", train)

    def output_activation(self, m: Cfg) -> str | None:
        return m["output_activation"]

    def params_by_component(self, m: Cfg) -> dict[str, int]:
        w = widths(m)
        return {"ffn": sum(linear_params(w, i) for i in range(len(w) - 1))}

    def layers(self, m: Cfg) -> int:
        return len(m["hidden"]) + 1

    def stage_tensors(
        self, m: Cfg, layers: range, ends: bool, tp: int, vocab_tp: bool = False
    ) -> list[int]:
        """Each Linear's weight and bias on one rank: a column layer holds 1/tp of both, a row
        layer 1/tp of its weight and all its bias."""
        w = widths(m)
        column = {c for c, _ in column_row_pairs(layers)} if tp > 1 else set()
        row = {c + 1 for c in column}

        def linear(i: int) -> list[int]:
            weights, bias = w[i] * w[i + 1], w[i + 1]
            if i in column:
                return [weights // tp, bias // tp]
            return [weights // tp, bias] if i in row else [weights, bias]

        return [n for i in layers for n in linear(i)]

    def largest_layer_params(self, m: Cfg, tp: int, vocab_tp: bool = False) -> int:
        w = widths(m)
        return max(linear_params(w, i) for i in range(len(w) - 1))

    def stage_flops_per_token(self, m: Cfg, data: Cfg, stages: list[range], tp: int) -> list[float]:
        """A split layer's work divides over the tensor ranks; an odd layer is whole on each."""
        w, out = widths(m), []
        for s in stages:
            split = {i for pair in column_row_pairs(s) for i in pair} if tp > 1 else set()
            out.append(sum(6 * linear_params(w, i) / (tp if i in split else 1) for i in s))
        return out

    def activation_bytes(self, m: Cfg, held: Activations) -> float:
        """Each Linear saves its input, the activation before it its output: the same tensor, so
        one value per width (the last: the loss's log-probabilities). Full recomputation keeps
        each Linear's input: the same, nothing saved. Selective keeps each Linear's output too
        (a matrix product's), besides the input its unit keeps."""
        w = widths(m)
        kept = sum(w) + (sum(w[1:]) if held.recompute == "selective" else 0)
        return held.in_flight * held.micro * kept * held.elem

    def stage_gemms(
        self, m: Cfg, data: Cfg, layers: range, last: bool, micro: int, tp: int, vocab_tp: bool
    ) -> list[Gemm]:
        """Each Linear layer of the stage; a column/row pair's split by the tensor ranks."""
        w, pairs = widths(m), column_row_pairs(layers) if tp > 1 else []
        column, row = {c for c, _ in pairs}, {r for _, r in pairs}

        def linear(i: int) -> Gemm:
            out, into = w[i + 1] // (tp if i in column else 1), w[i] // (tp if i in row else 1)
            return Gemm(micro, out, into)

        return [linear(i) for i in layers]

    def boundary_elements(self, m: Cfg, data: Cfg, stages: list[range]) -> list[int]:
        return [widths(m)[s.start] for s in stages[1:]]

    def check_tensor(self, m: Cfg, tp: int, stages: list[range]) -> None:
        pairs = [pair for stage in stages for pair in column_row_pairs(stage)]
        require(
            bool(pairs),
            "parallel.tp",
            "no pipeline stage holds two Linear layers to split as a column/row pair",
        )
        for column, _ in pairs:
            width = m["hidden"][column]
            require(
                width % tp == 0, f"model.hidden[{column}]", f"{width} does not split into tp={tp}"
            )

    def tp_traffic(
        self, m: Cfg, data: Cfg, samples: int, stages: list[range], microbatches: int
    ) -> tuple[float, float]:
        # Forward: the row layer's output; backward: the column layer's input gradient, which the
        # model's first layer has none of (its input is the data).
        w = widths(m)
        pairs = [pair for s in stages for pair in column_row_pairs(s)]
        elements = sum(samples * (w[r + 1] + (w[c] if c else 0)) for c, r in pairs)
        return elements, sum(1 + bool(c) for c, _ in pairs) * microbatches

    def split_layer_passes(self, m: Cfg, stages: list[range]) -> int:
        return 2 * sum(len(column_row_pairs(s)) for s in stages)

    def stage_module(self, model: Any, layers: range, first: bool, last: bool) -> Any:
        from runner.models.ffnn.parallelize import stage_module

        return stage_module(model, layers)

    def stage_example(
        self, model: Any, layers: range, first: bool, last: bool, microbatch: int, seq_len: int
    ) -> tuple[Any, Any]:
        from runner.models.ffnn.parallelize import stage_example

        return stage_example(model, layers, first, microbatch)

    def parallelize(
        self, module: Any, tp_mesh: Any, vocab_parallel: bool = False, sequence: bool = False
    ) -> Any:
        from runner.models.plans import split_linear_pairs

        return split_linear_pairs(module, tp_mesh)

    def recompute_units(self, model: Any) -> list[Any]:
        """Each Linear's forward. A row-parallel layer all-reduces its output in DTensor's output
        hook, outside the forward that recomputation re-runs, and nothing re-run needs the sum:
        no collective runs again (the base's tp_recompute_traffic)."""
        from torch import nn

        return [layer for layer in model.layers if isinstance(layer, nn.Linear)]


SPEC = FFNNSpec(name="ffnn", config=FFNNConfig)
