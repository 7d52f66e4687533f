"""The neuron, as the runner sees it: n weights and a bias weight, never split."""

from __future__ import annotations

from runner.choices import ACTIVATIONS
from runner.errors import one_of, positive
from runner.models.neuron.config import NeuronConfig
from runner.models.spec import Cfg, Gemm, ModelSpec, matches_data


class NeuronSpec(ModelSpec):
    def check(self, m: Cfg, data: Cfg, train: bool) -> None:
        positive(m, "model", "n_inputs")
        # A neuron's output is its activation: "none" would make it a linear regression's.
        one_of(m["activation"], "model.activation", tuple(a for a in ACTIVATIONS if a != "none"))
        matches_data(m["n_inputs"], "model.n_inputs", data, "n_features", train)
        matches_data(1, "data.n_outputs", data, "n_outputs", train)  # one neuron, one output

    def output_activation(self, m: Cfg) -> str | None:
        return m["activation"]

    def params_by_component(self, m: Cfg) -> dict[str, int]:
        return {"ffn": m["n_inputs"] + 1}  # one weight per input and the bias weight

    def stage_tensors(
        self, m: Cfg, layers: range, ends: bool, tp: int, vocab_tp: bool = False
    ) -> list[int]:
        return [m["n_inputs"], 1]  # its weights, its bias

    def stage_gemms(
        self, m: Cfg, data: Cfg, layers: range, last: bool, micro: int, tp: int, vocab_tp: bool
    ) -> list[Gemm]:
        return [Gemm(micro, 1, m["n_inputs"])]  # a batch of inputs against one row of weights


SPEC = NeuronSpec(name="neuron", config=NeuronConfig)
