"""The mixture-of-experts decoder, as the runner sees it: the decoder's spec (runner/models/
decoder/spec.py) with each block's FFN replaced by a router and n_experts FFNs. A token runs
through top_k of them, so its FLOPs are the dense decoder's with k FFNs; every expert's weights,
gradients and optimizer state are held. Activations are the dense decoder's but for the FFN's:
each token's rows in the experts (top_k of them dropless, about capacity_factor x top_k under
Switch's capacity), each row's input and ReLU output, and the top_k outputs the combine weights.
Pipeline stages are the decoder's (by blocks); tensor parallelism splits the attention as the
decoder's and leaves the experts whole."""

from __future__ import annotations

import math
from typing import Any

from runner.errors import positive, require
from runner.models.decoder.spec import DecoderSpec, check_heads, vocab_rows
from runner.models.decoder.spec import block_tensors as decoder_block
from runner.models.moe.config import MoEConfig
from runner.models.spec import Activations, Cfg, Gemm


def moe_ffn_tensors(m: Cfg, ep: int = 1) -> list[int]:
    """One block's router and a rank's experts (n_experts / ep), in the module's order: router,
    up, its bias, down, its bias."""
    d, n, held = m["d_model"], m["n_experts"], m["n_experts"] // ep
    return [d * n, held * d * 4 * d, held * 4 * d, held * 4 * d * d, held * d]


def block_tensors(m: Cfg, tp: int = 1, ep: int = 1, experts: bool = True) -> list[int]:
    """The decoder's attention and first norm (split over tp as its), the router and this rank's
    experts, the second norm."""
    d = m["d_model"]
    router, *held = moe_ffn_tensors(m, ep)
    return [*decoder_block(m, tp)[:10], router, *(held if experts else []), d, d]


def capacity(m: Cfg, tokens: int) -> int:
    """Rows per expert for a micro-batch's tokens (runner/models/moe/model.py): Switch's
    capacity; dropless (no capacity_factor), an even share rounded up, what a balanced router
    sends each expert."""
    factor = m.get("capacity_factor")
    return math.ceil((factor or 1) * tokens * m["top_k"] / m["n_experts"])


def rows(m: Cfg, tokens: int) -> int:
    """The experts' rows for a micro-batch's tokens: dropless, each token's top_k copies, however
    the router spreads them; under Switch's capacity every expert's slots, empty ones included."""
    if m.get("capacity_factor") is None:
        return tokens * m["top_k"]
    return m["n_experts"] * capacity(m, tokens)


class MoESpec(DecoderSpec):
    experts = True
    sequence = False  # sequence parallelism splits the decoder's FFN, which this has none of

    def expert_layers(self, model: Any) -> list[Any]:
        from runner.models.moe.model import MoEFeedForward

        return [m for m in model.modules() if isinstance(m, MoEFeedForward)]

    def ffn_units(self, m: Cfg, held: Activations, tokens: int) -> float:
        """A block's experts, whole on every tensor-parallel rank, in s*b*h 16-bit values: per
        token its rows (top_k dropless; capacity_factor x top_k, rounded up, under Switch's
        capacity), each the row's input (h) and its ReLU output (4h), which the second product
        takes too; and the top_k outputs the combine weights by the router's gates
        (runner/models/moe/model.py). An expert parallel rank runs its experts on as many rows
        as it dispatched when the router is balanced; on more where its experts are busier."""
        slots = rows(m, tokens) / tokens
        return slots * (2 + 8) + 2 * m["top_k"]

    def ffn_saved_units(self, m: Cfg, held: Activations, tokens: int) -> float:
        """Selective recomputation keeps the experts' products' outputs: a slot's first (4h)
        and second (h), and the combine's (h per gate)."""
        slots = rows(m, tokens) / tokens
        return slots * (8 + 2) + 2 * m["top_k"]

    def ep_traffic(
        self, m: Cfg, data: Cfg, samples: int, microbatches: int, cp: int
    ) -> tuple[float, float, float]:
        """A forward pass's dispatches, each a block's rows of d_model values for a micro-batch
        of b samples of s/cp tokens (runner/models/moe/model.py): their elements and their
        all-to-alls; and the bytes of the token counts dropless routing sends first (n_experts
        int64 a block, one all-to-all each). A combine moves as many rows back."""
        tokens = samples // microbatches * data["seq_len"] // cp
        calls = m["n_layers"] * microbatches
        counts = 8 * m["n_experts"] * calls if m.get("capacity_factor") is None else 0
        return rows(m, tokens) * m["d_model"] * calls, calls, counts

    def check(self, m: Cfg, data: Cfg, train: bool) -> None:
        super().check(m, data, train)
        positive(m, "model", "n_experts", "top_k")
        factor = m.get("capacity_factor")
        require(
            factor is None or factor > 0,
            "model.capacity_factor",
            f"must be positive, or null for dropless routing; got {factor}",
        )
        n, k = m["n_experts"], m["top_k"]
        require(k <= n, "model.top_k", f"{k} experts a token of model.n_experts={n}")
        weight = m["balance_weight"]
        require(weight >= 0, "model.balance_weight", f"must be 0 or more, got {weight}")
        f = m.get("ffn_hidden")
        require(f is None, "model.ffn_hidden", f"the experts are 4 x d_model wide: null, got {f}")

    def params_by_component(self, m: Cfg) -> dict[str, int]:
        dense = super().params_by_component(m)
        del dense["ffn"]
        router, *experts = moe_ffn_tensors(m)
        return {**dense, "router": m["n_layers"] * router, "experts": m["n_layers"] * sum(experts)}

    def active_params(self, m: Cfg) -> int:
        """The weights one token runs through: k of each block's experts."""
        every = self.params_by_component(m)
        return self.params(m) - every["experts"] * (1 - m["top_k"] / m["n_experts"])

    def flops_per_token(self, m: Cfg, data: Cfg) -> float:
        return 6 * self.active_params(m) + 12 * m["n_layers"] * data["seq_len"] * m["d_model"]

    def stage_tensors(
        self, m: Cfg, layers: range, ends: bool, tp: int, vocab_tp: bool = False, ep: int = 1,
        experts: bool = True,
    ) -> list[int]:  # fmt: skip
        """A rank's: n_experts / ep experts a block (`experts` false: none of them)."""
        embedding = [vocab_rows(m, tp, vocab_tp) * m["d_model"]] if ends else []
        return embedding + [n for _ in layers for n in block_tensors(m, tp, ep, experts)]

    def largest_layer_params(self, m: Cfg, tp: int, vocab_tp: bool = False) -> int:
        return max(sum(block_tensors(m, tp)), vocab_rows(m, tp, vocab_tp) * m["d_model"])

    def stage_flops_per_token(self, m: Cfg, data: Cfg, stages: list[range], tp: int) -> list[float]:
        per_layer = (self.flops_per_token(m, data) - 6 * m["vocab_size"] * m["d_model"]) / m[
            "n_layers"
        ]
        head = 6 * m["vocab_size"] * m["d_model"]
        last = len(stages) - 1
        return [len(s) * per_layer + head * (i == last) for i, s in enumerate(stages)]

    def ffn_gemms(self, m: Cfg, tokens: int, tp: int) -> list[Gemm]:
        """The router's product and each expert's over its rows, in the decoder's FFN's place:
        under Switch's capacity every slot, empty ones included; dropless, an even share of the
        tokens' top_k copies (what a balanced router sends each expert, rounded up)."""
        d, n, slots = m["d_model"], m["n_experts"], capacity(m, tokens)
        return [
            Gemm(tokens, n, d),  # router
            Gemm(slots, 4 * d, d, count=n),  # each expert's up
            Gemm(slots, d, 4 * d, count=n),  # and down
        ]

    # --- tensor parallelism: the attention split as the decoder's, the experts whole ---
    def check_tensor(self, m: Cfg, tp: int, stages: list[range]) -> None:
        check_heads(m, tp)

    def parallelize(
        self, module: Any, tp_mesh: Any, vocab_parallel: bool = False, sequence: bool = False
    ) -> Any:
        from runner.models.decoder.parallelize import parallelize

        return parallelize(module, tp_mesh, vocab_parallel, ffn=False)

    def tp_traffic(
        self, m: Cfg, data: Cfg, samples: int, stages: list[range], microbatches: int
    ) -> tuple[float, float]:
        """The attention's all-reduces alone: its output's forward, its input's backward."""
        elements, calls = super().tp_traffic(m, data, samples, stages, microbatches)
        return elements / 2, calls / 2

    def tp_recompute_traffic(
        self, m: Cfg, data: Cfg, samples: int, stages: list[range], microbatches: int, mode: str
    ) -> tuple[float, float]:
        elements, calls = super().tp_recompute_traffic(m, data, samples, stages, microbatches, mode)
        return elements / 2, calls / 2

    def split_layer_passes(self, m: Cfg, stages: list[range]) -> int:
        return 4 * m["n_layers"]  # Q, K, V, output

    def recompute_units(self, model: Any) -> list[Any]:
        return list(model.blocks)


SPEC = MoESpec(name="moe", config=MoEConfig)
