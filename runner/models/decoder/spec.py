"""The decoder, as the runner sees it: sizes, FLOPs and activations from its config, how a
pipeline splits it (by blocks; the tied embedding on the first and last stage) and how tensor
parallelism splits each block (Megatron-LM: 2 all-reduces of b*s*h forward, 2 backward)."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from runner.errors import positive, require
from runner.models.decoder.config import DecoderConfig
from runner.models.spec import Activations, Cfg, Gemm, ModelSpec, matches_data


def kv_width(m: Cfg) -> int:
    """The keys' (and values') width: d_model, or n_kv_heads heads under grouped-query
    attention."""
    return m["d_model"] // m["n_heads"] * (m.get("n_kv_heads") or m["n_heads"])


def kv_share(m: Cfg) -> float:
    return kv_width(m) / m["d_model"]


def ffn_width(m: Cfg) -> int:
    return m.get("ffn_hidden") or 4 * m["d_model"]


def check_heads(m: Cfg, tp: int) -> None:
    """Tensor parallelism gives each rank whole heads, queries' and keys' alike."""
    heads = m["n_heads"]
    require(heads % tp == 0, "model.n_heads", f"{heads} heads do not split into tp={tp}")
    kv = m.get("n_kv_heads") or heads
    require(kv % tp == 0, "model.n_kv_heads", f"{kv} key/value heads do not split into tp={tp}")


def block_tensors(m: Cfg, tp: int) -> list[int]:
    """One block's parameter tensors on one tensor-parallel rank, in the module's order (Q, K, V,
    output, norm, up, down, norm): split layers hold 1/tp of theirs, the row-parallel biases (the
    output projection's, down's) and the norms are whole."""
    d, kv, f = m["d_model"], kv_width(m), ffn_width(m)
    attention = [d * d // tp, d // tp, *[d * kv // tp, kv // tp] * 2, d * d // tp, d]
    ffn = [f * d // tp, f // tp, f * d // tp, d]
    return [*attention, d, d, *ffn, d, d]


def block_params(m: Cfg, tp: int) -> int:
    return sum(block_tensors(m, tp))


def tp_sums(held: Activations) -> float:
    """A row-parallel product's sum over the tp ranks, which selective recomputation keeps beside
    its output, in s*b*h 16-bit values: whole (an all-reduce's), a t-th under sequence
    parallelism (a reduce-scatter's), none without tp."""
    if held.tp == 1:
        return 0.0
    return 2 / held.tp if held.sequence else 2


def vocab_rows(m: Cfg, tp: int, vocab_tp: bool) -> int:
    """The embedding's rows on the busiest tensor-parallel rank: a vocabulary split over the
    ranks gives each vocab/tp (DTensor's Shard(0), as torch.chunk: the first ranks the larger
    share when it does not divide)."""
    return -(-m["vocab_size"] // tp) if vocab_tp else m["vocab_size"]


class DecoderSpec(ModelSpec):
    sequence = True  # a sequence dimension to split (parallel.sequence_parallel)
    tied_ends = True  # the embedding is the output layer too
    fp32_stream = True  # blocks add to the residual stream, which autocast leaves fp32

    def check(self, m: Cfg, data: Cfg, train: bool) -> None:
        positive(m, "model", "vocab_size", "context_len", "d_model", "n_heads", "n_layers")
        d, heads = m["d_model"], m["n_heads"]
        require(d % heads == 0, "model.d_model", f"{d} must be divisible by model.n_heads={heads}")
        kv = m.get("n_kv_heads")
        require(
            kv is None or (kv > 0 and heads % kv == 0),
            "model.n_kv_heads",
            f"must divide model.n_heads={heads} (or be null: as many as n_heads), got {kv}",
        )
        f = m.get("ffn_hidden")
        require(f is None or f > 0, "model.ffn_hidden", f"must be positive or null, got {f}")
        require(d % 2 == 0, "model.d_model", f"must be even for sin/cos positions, got {d}")
        require(0 <= m["dropout"] < 1, "model.dropout", f"must be in [0, 1), got {m['dropout']}")
        matches_data(m["vocab_size"], "model.vocab_size", data, "vocab_size", train)
        seq_len = data.get("seq_len")
        if seq_len is not None:
            require(
                0 < seq_len <= m["context_len"],
                "data.seq_len",
                f"must be in 1..model.context_len={m['context_len']}, got {seq_len}",
            )

    def output_activation(self, m: Cfg) -> str | None:
        return "none"  # logits: cross-entropy applies the softmax

    def params_by_component(self, m: Cfg) -> dict[str, int]:
        d, layers, kv, f = m["d_model"], m["n_layers"], kv_width(m), ffn_width(m)
        attention = 2 * (d * d + d) + 2 * (d * kv + kv)  # Q, output; K, V: with biases
        ffn = 2 * f * d + f + d  # up (d -> f) and down (f -> d) with biases
        return {
            "embedding": m["vocab_size"] * d,  # tied: the output layer reuses it
            "attention": layers * attention,
            "ffn": layers * ffn,
            "norm": layers * 2 * 2 * d,  # two LayerNorms, weight and bias
        }

    def layers(self, m: Cfg) -> int:
        return m["n_layers"]

    def stage_shape(self, layers: range) -> Hashable:
        """Every block alike: a stage's sizes and products depend on how many it holds, not on
        which (a search's stages of a pipeline's middle share their figures)."""
        return len(layers)

    def stage_tensors(
        self, m: Cfg, layers: range, ends: bool, tp: int, vocab_tp: bool = False
    ) -> list[int]:
        embedding = [vocab_rows(m, tp, vocab_tp) * m["d_model"]] if ends else []
        return embedding + [n for _ in layers for n in block_tensors(m, tp)]

    def largest_layer_params(self, m: Cfg, tp: int, vocab_tp: bool = False) -> int:
        return max(block_params(m, tp), vocab_rows(m, tp, vocab_tp) * m["d_model"])

    def tokens_per_sample(self, data: Cfg) -> int:
        return data["seq_len"]

    def flops_per_token(self, m: Cfg, data: Cfg) -> float:
        """6 per parameter, and 12 * layers * seq * d for the attention scores."""
        return 6 * self.params(m) + 12 * m["n_layers"] * data["seq_len"] * m["d_model"]

    def stage_flops_per_token(self, m: Cfg, data: Cfg, stages: list[range], tp: int) -> list[float]:
        """Blocks divide over the tensor ranks; the tied output layer, on the last stage, does
        not (every tensor rank computes it whole)."""
        d = m["d_model"]
        block = 6 * block_params(m, 1) + 12 * data["seq_len"] * d
        head = 6 * m["vocab_size"] * d
        last = len(stages) - 1
        return [len(s) * block / tp + head * (i == last) for i, s in enumerate(stages)]

    def activation_bytes(self, m: Cfg, held: Activations) -> float:
        """Korthikanti et al. (2022)'s count, for this runner's block: without recomputation
        s*b*h*(9 + 16/t + 5*a*s/(h*t)) bytes per layer at 16 bits; with sequence parallelism the
        9 that every tensor-parallel rank held whole (the norms' inputs and outputs, the FFN
        output's dropout mask) split too: s*b*h*(25/t + 5*a*s/(h*t)). Their 10 + 24/t and 34/t
        are Megatron's block, whose GeLU keeps two 4h tensors (ffn_units) and which drops the
        attention's output too. A mask is a byte on a GPU, the input's dtype on a CPU
        (Activations.mask_bytes). The attention's 5*a*s/(h*t) (softmax's output, dropout's mask
        and the dropped weights; softmax's 2 alone without dropout) only where the math attention
        runs (a CPU with dropout: the suite's default decoder); a fused kernel keeps none. Plus,
        on the last stage, the fp32 logits and the output layer's input; on the first, the
        embedding's dropout mask. Autograd's saved-tensor hooks count the same bytes
        (tests/test_activations.py).
        Selective recomputation keeps what the runner's policy saves (runner/models/recompute.py):
        each block's input, the matrix products' outputs (Q, K, V and the FFN's first, a t-th
        each; the output projection's and the FFN's second, whole, and their sums over tp beside
        them, a t-th under sequence parallelism), attention's output and, on the math path, its
        scores (2*a*s/(h*t)). Full: each layer's input (s*b*h values of the
        residual stream, fp32 under autocast) and one layer's whole set at a time, in backward.
        With context parallelism every rank holds s/cp positions of all of it; its ring attention
        keeps no scores (runner/layouts/context/ring.py), only dropout's masks, a byte each of
        the pairs it computed (its own s/cp x s/cp block, half of each other rank's); while
        backward runs, one block's working set."""
        s, b, h, a, t = held.seq_len // held.cp, held.micro, m["d_model"], m["n_heads"], held.tp
        ring = held.cp > 1

        dropout, math = bool(m.get("dropout", 0)), not held.fused_attention
        # a dropout's mask element in the formula's 16-bit values (a byte: 1), and the embedding's
        # (its output is the residual stream's dtype)
        mask = 2 * (held.mask_bytes or held.elem) / held.elem
        stream_mask = held.mask_bytes or held.stream
        # Q, K, V and attention's output, a t-th each: the math path saves K and V repeated to
        # every query head under grouped-query attention, a fused kernel and the ring their own
        # (and selective recomputation the projections' outputs, repeated again in backward)
        narrow = 4 + 4 * kv_share(m)
        qkv = 8 if math and not ring else narrow

        # The math path computes 16-bit attention in fp32 (torch's default: SDPA's math kernel
        # upcasts 16-bit inputs, allow_fp16_bf16_reduction_math_sdp off) and keeps its scores so
        wide = 4 / held.elem

        def per_layer() -> float:
            # softmax's output; with dropout its mask and the dropped weights V is multiplied by
            scores = a * s / (h * t) * (2 + dropout * (mask + 2)) * wide if math else 0
            if ring:  # bytes of masks for the pairs computed (bool, its own), in 16-bit values
                pairs = s * (held.cp + 1) / 2  # its own block whole, half of each other's
                scores = a * pairs / (h * t) * 2 / held.elem if dropout else 0
            # what lies between the split layers: the two norms' inputs and outputs, and the FFN
            # output's dropout mask (Megatron's blocks drop the attention's output too: 2 masks)
            outside = 8 + mask * dropout
            outside /= t if held.sequence else 1
            inside = qkv / t + self.ffn_units(m, held, s * b)  # the attention's, the FFN's
            return s * b * h * (outside + inside + scores) * held.elem / 2

        def saved() -> float:  # what selective recomputation keeps (the docstring)
            stream = 2 / t if held.sequence else 2
            scores = 2 * a * s / (h * t) * wide if math and not ring else 0
            projection = 2 + tp_sums(held)  # the output projection's output and its sum
            kept = stream + narrow / t + self.ffn_saved_units(m, held, s * b) + projection + scores
            return s * b * h * kept * held.elem / 2

        # fp32 for the loss, on the last stage; a vocabulary split over the tp ranks splits them;
        # and the output layer's input, the final norm's output, whole
        logits = s * b * (vocab_rows(m, t, held.vocab_tp) * 4 + h * held.elem) if held.output else 0
        # the embedding's dropout mask, on the first stage, each micro-batch in flight
        logits += held.in_flight * s * b * h * stream_mask if held.embedding and dropout else 0
        # The ring's backward works on one block at a time: its weights, their gradient and two
        # temporaries of the same s/cp x s/cp size, fp32, per sample and head of this rank's
        logits += 4 * b * (a // t) * s * s * 4 if ring else 0
        if held.recompute == "full":
            block_input = s * b * h * self.between_layers_bytes(held.elem, held.stream)
            block_input /= t if held.sequence else 1  # each rank's positions of the stream
            return held.in_flight * held.layers * block_input + per_layer() + logits
        if held.recompute == "selective":
            return held.in_flight * held.layers * saved() + logits
        return held.in_flight * held.layers * per_layer() + logits

    def ffn_saved_units(self, m: Cfg, held: Activations, tokens: int) -> float:
        """What selective recomputation keeps of a block's FFN, in s*b*h 16-bit values: its first
        product's output (ffn_hidden, 4h by default, a t-th), its second's (whole) and that one's
        sum over tp."""
        return 2 * ffn_width(m) / m["d_model"] / held.tp + 2 + tp_sums(held)

    def ffn_units(self, m: Cfg, held: Activations, tokens: int) -> float:
        """What a block's FFN keeps between its split layers, in s*b*h 16-bit values: its ReLU's
        output, ffn_hidden wide (4h by default), a t-th on each rank, which ReLU's backward reads
        and the second layer keeps as its input, one tensor. Korthikanti et al. count two (GeLU
        reads its input, the first layer's output: 4 x 4h); here the first layer's output is freed
        once ReLU has read it (the default decoder at a batch of 64: 24 such values a block saved
        for backward, counted by autograd's saved-tensor hooks, where the GeLU count makes 32)."""
        return 2 * ffn_width(m) / m["d_model"] / held.tp

    def stage_gemms(
        self, m: Cfg, data: Cfg, layers: range, last: bool, micro: int, tp: int, vocab_tp: bool,
        cp: int = 1,
    ) -> list[Gemm]:  # fmt: skip
        """Per block: Q, K, V and the FFN's first layer split by columns, the attention's output
        and the FFN's second by rows; the attention scores and their weighting of V, one product
        per sample and head of this rank's share. The tied output layer on the last stage. With
        `cp` context-parallel ranks, each rank's s/cp positions, its queries against its own keys
        and, in the ring's cp - 1 other steps, the half of each block the causal mask leaves
        visible (runner/layouts/context/ring.py computes only that half). Each block's product
        once, its count times the stage's blocks."""
        d, s, heads, kv = m["d_model"], data["seq_len"] // cp, m["n_heads"], kv_width(m)
        tokens, per_head, hd = micro * s, micro * heads // tp, d // heads
        qkv = [Gemm(tokens, d // tp, d, count=3)]  # Q, K, V
        if kv != d:  # grouped-query attention's narrower K and V
            qkv = [Gemm(tokens, d // tp, d), Gemm(tokens, kv // tp, d, count=2)]
        scores = [
            Gemm(s, s, hd, count=per_head, attention=True, causal=True, scores=True),  # Q K^T
            Gemm(s, hd, s, count=per_head, attention=True, causal=True),  # softmax(.) V
        ]
        if cp > 1:
            others = per_head * (cp - 1)
            scores += [Gemm(s // 2, s, hd, count=others, attention=True, scores=True),
                       Gemm(s // 2, hd, s, count=others, attention=True)]  # fmt: skip
        attention = [*qkv, Gemm(tokens, d, d // tp)]  # and the output projection
        block = [*attention, *self.ffn_gemms(m, tokens, tp), *scores]
        # every block's products alike: once each, run as many times more as the stage has blocks
        # (a search prices thousands of stages: a product's time is its count's multiple)
        out = [g.times(len(layers)) for g in block] if len(layers) else []
        if last:
            out.append(Gemm(tokens, vocab_rows(m, tp, vocab_tp), d, recomputed=False))
        return out

    def ffn_gemms(self, m: Cfg, tokens: int, tp: int) -> list[Gemm]:
        """A block's FFN: up split by columns, down by rows."""
        d, f = m["d_model"], ffn_width(m)
        return [Gemm(tokens, f // tp, d), Gemm(tokens, d, f // tp)]

    def boundary_elements(self, m: Cfg, data: Cfg, stages: list[range]) -> list[int]:
        return [data["seq_len"] * m["d_model"] for _ in stages[1:]]

    def stage_module(self, model: Any, layers: range, first: bool, last: bool) -> Any:
        from runner.models.decoder.parallelize import DecoderStage

        return DecoderStage(model, layers, first, last)

    def stage_example(
        self, model: Any, layers: range, first: bool, last: bool, microbatch: int, seq_len: int
    ) -> tuple[Any, Any]:
        from runner.models.decoder.parallelize import stage_example

        return stage_example(model, first, last, microbatch, seq_len)

    def tied_weight(self, stage: Any) -> Any:
        return stage.embed.weight if stage.embed is not None else None

    def tied_elements(self, m: Cfg, tp: int, vocab_tp: bool) -> int:
        return vocab_rows(m, tp, vocab_tp) * m["d_model"]

    def check_tensor(self, m: Cfg, tp: int, stages: list[range]) -> None:
        check_heads(m, tp)
        f = ffn_width(m)
        require(f % tp == 0, "model.ffn_hidden", f"the FFN's width {f} does not split into tp={tp}")

    def tp_traffic(
        self, m: Cfg, data: Cfg, samples: int, stages: list[range], microbatches: int
    ) -> tuple[float, float]:
        layers = m["n_layers"]
        return 4 * samples * data["seq_len"] * m["d_model"] * layers, 4 * layers * microbatches

    def sp_traffic(
        self, m: Cfg, data: Cfg, samples: int, microbatches: int, vocab_tp: bool
    ) -> tuple[float, float, float]:
        """Sequence parallelism's all-gathers and reduce-scatters (runner/models/decoder/
        parallelize.py), each of b*s*h per micro-batch of b samples. Per block 2 all-gathers and
        2 reduce-scatters forward, as many backward: half of them carry the fp32 stream (the
        norms' outputs, their gradients), half the layers' outputs and their gradients, in what
        autocast computes, as tensor parallelism's all-reduces do. At the ends, fp32: the stream
        split into the first block (an all-gather backward) and gathered out of the last (one
        forward; with the vocabulary split, a reduce-scatter backward). Measured with the tensor
        probe."""
        bsh, layers = samples * data["seq_len"] * m["d_model"], m["n_layers"]
        ends = 2 + vocab_tp
        return 8 * layers * bsh, ends * bsh, (8 * layers + ends) * microbatches

    def sp_tp_traffic(self, m: Cfg, microbatches: int) -> tuple[float, float]:
        """The norms' weights, whole on every rank, each rank's gradient from its own positions:
        one all-reduce of each (2 norms x weight and bias, h each) per block and micro-batch."""
        return 4 * m["d_model"] * m["n_layers"] * microbatches, 4 * m["n_layers"] * microbatches

    def vocab_tp_traffic(
        self,
        m: Cfg,
        data: Cfg,
        samples: int,
        stages: list[range],
        microbatches: int,
        sequence: bool = False,
    ) -> tuple[float, float, float]:
        """Per micro-batch of b samples, in the residual stream's width (fp32 under autocast,
        which the embedding runs outside; 16 bits over 16-bit weights): the embedding's forward
        all-reduce (b*s*h) and the output layer's backward one of its input gradient (b*s*h),
        which flows back into the stream; in fp32 (the loss takes fp32 logits): loss_parallel's
        three in forward (b*s each: the max, the sum of exponentials, the target's logit; none in
        backward). Measured with the tensor probe (runner/layouts/tensor/probe.py). With sequence
        parallelism the output layer's backward reduce-scatters instead (sp_traffic)."""
        tokens = samples * data["seq_len"]
        if sequence:
            return tokens * m["d_model"], tokens * 3, 4 * microbatches
        return tokens * 2 * m["d_model"], tokens * 3, 5 * microbatches

    def tp_recompute_traffic(
        self, m: Cfg, data: Cfg, samples: int, stages: list[range], microbatches: int, mode: str
    ) -> tuple[float, float]:
        """Full recomputation re-runs each block's forward: its 2 all-reduces of b*s*h again
        (Megatron's count); selective saves their outputs and runs none (under sequence
        parallelism the stream's all-gathers, as many, run again: runner/layouts/tensor/
        traffic.py)."""
        if mode != "full":
            return 0.0, 0.0
        layers = m["n_layers"]
        return 2 * samples * data["seq_len"] * m["d_model"] * layers, 2 * layers * microbatches

    def split_layer_passes(self, m: Cfg, stages: list[range]) -> int:
        return 6 * m["n_layers"]  # Q, K, V, output; the FFN's two

    def vocab_split_passes(self, m: Cfg) -> int:
        return 3  # the embedding, the output layer, the loss on its sharded logits

    def parallelize(
        self, module: Any, tp_mesh: Any, vocab_parallel: bool = False, sequence: bool = False
    ) -> Any:
        from runner.models.decoder.parallelize import parallelize

        return parallelize(module, tp_mesh, vocab_parallel, sequence)

    def split_context(self, module: Any, attention: Any, positions: list[int]) -> Any:
        from runner.models.decoder.parallelize import split_context

        return split_context(module, attention, positions)

    def cp_traffic(
        self, m: Cfg, data: Cfg, samples: int, microbatches: int, cp: int, tp: int
    ) -> tuple[float, float]:
        """One exchange of the ring attention's K and V (runner/layouts/context/ring.py), b*(s/cp)
        values of its key/value width/tp each (h/tp without grouped-query attention), in every
        block of every micro-batch of b samples; the calls."""
        layers = m["n_layers"]
        kv = 2 * samples * (data["seq_len"] // cp) * (kv_width(m) // tp) * layers
        return kv, layers * microbatches

    def recompute_units(self, model: Any) -> list[Any]:
        return list(model.blocks)


SPEC = DecoderSpec(name="decoder", config=DecoderConfig)
