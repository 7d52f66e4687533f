"""What the runner asks of a model, in one place: a ModelSpec per model (runner/models/registry.py).

Validation, the planner and the parallel layouts never look at a model's class or `_target_`:
they ask its spec. A spec has two halves: `PlannedModel`, what the planner and the rules ask
(sizes, FLOPs, activations, each dimension's traffic, from the config alone), and `RunningModel`,
what a running layout asks of the built module (a pipeline's stages, the tensor-parallel split,
experts, the context split, recomputation's units). The defaults describe a model that is never
split: one layer, so data parallelism only; a model that can be split overrides what it supports
(the decoder and the FFNN in their folders). A model of `layers` that reads a vector gets its
pipeline stages by default. Nothing here imports torch: validation and `mode=plan` stay light;
the methods that build or split modules import it when called.

`m` is always the model's config (a mapping of its fields), `data` the data config.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any

from runner.errors import require

Cfg = Mapping[str, Any]


@dataclass(frozen=True)
class Activations:
    """What a stage holds in flight, for activation memory: one rank's busiest stage."""

    micro: int  # samples per micro-batch on one replica
    seq_len: int  # tokens per sample (0 for vector data)
    layers: int  # the most layers one stage holds
    in_flight: int  # micro-batches whose activations a stage keeps at once
    tp: int
    elem: int  # bytes per element at the training dtype
    recompute: str  # trainer.recompute: none | full | selective
    vocab_tp: bool = False  # the vocabulary split over the tp ranks (parallel.vocab_parallel)
    sequence: bool = False  # what lies between the split layers split along the sequence too
    cp: int = 1  # context-parallel ranks: each holds seq_len / cp of every sample's positions
    # Attention by a fused kernel that keeps no scores (torch's flash and memory-efficient SDPA:
    # on a GPU always, on a CPU without dropout); false: the math path, which keeps them
    fused_attention: bool = False
    stream: int = 4  # bytes per element of the residual stream (fp32 under autocast)
    output: bool = True  # the rank holds the model's output (a pipeline's last stage's rank)
    embedding: bool = True  # the rank holds the model's input (a pipeline's first stage's rank)
    # What a dropout keeps for backward, per element: CUDA's fused dropout a bool mask, 1 byte; a
    # CPU's its noise (at::dropout multiplies by a tensor of the input's dtype): None says that.
    mask_bytes: int | None = 1


@dataclass(frozen=True)
class Gemm:
    """One matrix product of a forward pass, (m x k) @ (k x n), run `count` times per micro-batch
    on one tensor-parallel rank. Backward runs two of the same size (input and weight gradients);
    `recomputed`: full activation recomputation runs it again (the blocks, not the output layer);
    `attention`: a product of attention's scores, beside which a ring attention's exchanges run
    (context parallelism); `causal`: a square under the causal mask, of which a fused kernel
    computes the tiles on and below the diagonal; `scores`: Q K^T, which a kernel that keeps no
    scores computes again in backward (runner/planner/attention.py)."""

    m: int
    n: int
    k: int
    count: float = 1
    recomputed: bool = True
    attention: bool = False
    causal: bool = False
    scores: bool = False

    @property
    def flops(self) -> float:
        return 2 * self.m * self.n * self.k * self.count

    def times(self, n: int) -> Gemm:
        """The same product run n times as often (dataclasses.replace's result, a third of its
        time: a search makes hundreds of thousands)."""
        return Gemm(self.m, self.n, self.k, self.count * n, self.recomputed, self.attention,
                    self.causal, self.scores)  # fmt: skip


class PlannedModel:
    """What the planner and the rules ask of a model: its rules, sizes, FLOPs, activations and
    each parallel dimension's traffic, from its config alone (`m`, `data`). Torch-free: validation,
    `mode=plan` and `mode=search` ask only this half."""

    name: str  # ModelSpec's

    # --- validation ---
    def check(self, m: Cfg, data: Cfg, train: bool) -> None:
        """The model's own rules (raise runner.errors.ConfigError through `require`)."""

    def output_activation(self, m: Cfg) -> str | None:
        """The activation the model's output ends in (a loss may need one: bce a sigmoid)."""
        return None

    # --- sizes ---
    def params_by_component(self, m: Cfg) -> dict[str, int]:
        raise NotImplementedError(f"model {self.name}: its spec gives no parameter count")

    def params(self, m: Cfg) -> int:
        return sum(self.params_by_component(m).values())

    def layers(self, m: Cfg) -> int:
        """How many layers a pipeline can split the model into."""
        return 1

    def stage_shape(self, layers: range) -> Hashable:
        """What of a stage's layers its sizes and products depend on (runner/memo.py keeps a
        search's stage figures under it): which layers they are, for layers that differ."""
        return layers.start, layers.stop

    def stage_tensors(
        self, m: Cfg, layers: range, ends: bool, tp: int, vocab_tp: bool = False
    ) -> list[int]:
        """Sizes of one stage's trainable tensors on one tensor-parallel rank, in module order
        (DDP buckets them in reverse); `ends`: the stage is the first or the last; `vocab_tp`:
        the vocabulary is split over the tp ranks (a model without one ignores it)."""
        return [self.params(m)]

    def largest_layer_params(self, m: Cfg, tp: int, vocab_tp: bool = False) -> int:
        """The largest layer as tensor parallelism splits it: the least a device must hold."""
        return self.params(m)

    # --- compute ---
    def tokens_per_sample(self, data: Cfg) -> int:
        return 1

    def flops_per_token(self, m: Cfg, data: Cfg) -> float:
        """Training FLOPs per token: 6 per parameter (forward 2, backward 4; Kaplan et al.)."""
        return 6 * self.params(m)

    def stage_flops_per_token(self, m: Cfg, data: Cfg, stages: list[range], tp: int) -> list[float]:
        """Each stage's FLOPs per token on its busiest tensor-parallel rank: here the model's,
        shared by the stages as their layers."""
        layers = sum(len(s) for s in stages)
        return [self.flops_per_token(m, data) * len(s) / layers for s in stages]

    def activation_bytes(self, m: Cfg, held: Activations) -> float:
        return 0.0  # too small to count

    def stage_gemms(
        self, m: Cfg, data: Cfg, layers: range, last: bool, micro: int, tp: int, vocab_tp: bool
    ) -> list[Gemm] | None:
        """The forward pass's matrix products of one stage for a micro-batch of `micro` samples
        on one tensor-parallel rank (`vocab_tp`: the output layer split by vocabulary). None: not
        known, the planner prices the FLOPs at the profile's best matmul efficiency."""
        return None

    # What one layer hands the next under mixed precision: autocast's 16 bits, unless layers add
    # their outputs to a stream autocast leaves fp32 (a transformer's residual stream). That is what
    # a pipeline sends between stages and what tensor parallelism's backward all-reduces carry.
    fp32_stream = False

    def between_layers_bytes(self, activation_bytes: int, stream_bytes: int = 4) -> int:
        """What layers hand each other: the residual stream's width (`stream_bytes`: fp32
        under autocast, 16 bits over 16-bit weights) where the model keeps one, else the
        activations'."""
        return stream_bytes if self.fp32_stream else activation_bytes

    # A sequence dimension that sequence parallelism (parallel.sequence_parallel) and context
    # parallelism (parallel.cp) split: a model with one splits it in `parallelize(...,
    # sequence=True)` and `split_context`
    sequence = False

    # --- pipeline parallelism ---
    def boundary_elements(self, m: Cfg, data: Cfg, stages: list[range]) -> list[int]:
        """Elements of one sample's activation crossing each boundary between stages."""
        raise NotImplementedError(f"model {self.name} has no pipeline split")

    # The first and last layers share a weight: a pipeline's first and last stage each hold it and
    # sum its gradients every step (tied_weight finds it in a stage). Same on every rank.
    tied_ends = False

    def tied_elements(self, m: Cfg, tp: int, vocab_tp: bool) -> int:
        """The shared weight's elements on one tensor-parallel rank (0: none shared)."""
        return 0

    # --- tensor parallelism ---
    def check_tensor(self, m: Cfg, tp: int, stages: list[range]) -> None:
        require(False, "parallel.tp", f"model {self.name} has no layer to split")

    def tp_traffic(
        self, m: Cfg, data: Cfg, samples: int, stages: list[range], microbatches: int
    ) -> tuple[float, float]:
        """Elements handed to tensor-parallel collectives for `samples` samples of one replica,
        and the calls, per step over the whole stack of stages."""
        return 0.0, 0.0

    def vocab_tp_traffic(
        self,
        m: Cfg,
        data: Cfg,
        samples: int,
        stages: list[range],
        microbatches: int,
        sequence: bool = False,
    ) -> tuple[float, float, float]:
        """Like tp_traffic, the collectives of a vocabulary split over the tensor-parallel ranks
        (parallel.vocab_parallel): elements of the residual stream's width (runner/precision.py),
        elements of fp32 logits, and calls; with `sequence`, under sequence parallelism."""
        return 0.0, 0.0, 0.0

    def sp_traffic(
        self, m: Cfg, data: Cfg, samples: int, microbatches: int, vocab_tp: bool
    ) -> tuple[float, float, float]:
        """Sequence parallelism's all-gathers and reduce-scatters (models with a `sequence`):
        the blocks' elements (as tp_traffic's, at their precisions), the ends' (fp32), calls."""
        return 0.0, 0.0, 0.0

    def sp_tp_traffic(self, m: Cfg, microbatches: int) -> tuple[float, float]:
        """What tensor parallelism still all-reduces in the blocks under sequence parallelism:
        fp32 elements (weights' gradients), calls."""
        return 0.0, 0.0

    def tp_recompute_traffic(
        self, m: Cfg, data: Cfg, samples: int, stages: list[range], microbatches: int, mode: str
    ) -> tuple[float, float]:
        """Like tp_traffic, the forward collectives that recomputation (trainer.recompute) runs
        again in backward: elements at the forward's precision, and calls."""
        return 0.0, 0.0

    # --- expert parallelism (parallel.ep) ---
    experts = False  # a mixture of experts, whose experts expert parallelism places

    def ep_traffic(
        self, m: Cfg, data: Cfg, samples: int, microbatches: int, cp: int
    ) -> tuple[float, float, float]:
        """A forward pass's dispatches of the experts' rows, summed over blocks and a replica's
        micro-batches of `samples`: their elements, their all-to-alls, and the bytes of the
        token counts sent before them (models with experts)."""
        return 0.0, 0.0, 0.0

    # --- context parallelism (parallel.cp) ---
    def cp_traffic(
        self, m: Cfg, data: Cfg, samples: int, microbatches: int, cp: int, tp: int
    ) -> tuple[float, float]:
        """Elements of one exchange of a ring attention's keys and values (models with a
        `sequence`), summed over its layers and a replica's micro-batches; the calls."""
        return 0.0, 0.0

    def split_layer_passes(self, m: Cfg, stages: list[range]) -> int:
        """Tensor-parallel layers the whole stack runs forward and backward per micro-batch."""
        return 0

    def vocab_split_passes(self, m: Cfg) -> int:
        """Split layers a micro-batch adds with the vocabulary split (parallel.vocab_parallel)."""
        return 0


class RunningModel:
    """What a running layout asks of a model: a pipeline's stages, its tensor-parallel split,
    its experts, its context split and the units recomputation wraps, on the built module
    (`model`). Each method imports torch when it is called."""

    name: str  # ModelSpec's

    # --- pipeline parallelism ---
    def stage_module(self, model: Any, layers: range, first: bool, last: bool) -> Any:
        """The module of one pipeline stage: the model's own layers, shared, not copied. By
        default a model whose `layers` holds one module per layer (PlannedModel.layers counts
        them) runs a stage as those layers in turn."""
        from torch import nn

        held = getattr(model, "layers", None)
        if not isinstance(held, nn.Sequential):
            raise NotImplementedError(f"model {self.name}: no `layers` to cut into stages")
        return nn.Sequential(*(held[i] for i in layers))

    def stage_example(
        self, model: Any, layers: range, first: bool, last: bool, microbatch: int, seq_len: int
    ) -> tuple[Any, Any]:
        """A stage's input and output for one micro-batch, on the meta device. By default, for a
        model of `layers` that reads a vector (its first Linear's width): the layers up to the
        stage's end run on meta tensors, weights included, so nothing is computed or copied."""
        import torch
        from torch import nn
        from torch.func import functional_call

        held = self.stage_module(model, range(layers.stop), True, last)
        linear = next((m for m in held.modules() if isinstance(m, nn.Linear)), None)
        if linear is None:
            raise NotImplementedError(f"model {self.name}: give its stages' example shapes")
        x = torch.empty(microbatch, linear.in_features, device="meta")
        for i, layer in enumerate(held):
            meta = {k: torch.empty_like(v, device="meta") for k, v in layer.named_parameters()}
            if i == layers.start:
                x = x.detach().requires_grad_(not first)
                start = x
            x = functional_call(layer, meta, (x,))
        return start, x.detach().requires_grad_(True)

    def tied_weight(self, stage: Any) -> Any:
        """The shared weight as a stage holds it, or None."""
        return None

    # --- tensor parallelism ---
    def parallelize(
        self, module: Any, tp_mesh: Any, vocab_parallel: bool = False, sequence: bool = False
    ) -> Any:
        """Split a whole model, or one pipeline stage, over the tensor-parallel mesh; with
        `vocab_parallel`, its vocabulary too where it has one; with `sequence` (only where the
        spec's `sequence` says it has one) the activations between the split layers along it."""
        raise NotImplementedError(f"model {self.name} has no tensor-parallel plan")

    # --- expert parallelism (parallel.ep) ---
    def expert_layers(self, model: Any) -> list[Any]:
        """The model's (or a stage's) mixture-of-experts blocks: each has `experts` (a module of
        stacked expert weights, first dimension the expert), `n_experts` and `exchange`."""
        return []

    # --- context parallelism (parallel.cp) ---
    def split_context(self, module: Any, attention: Any, positions: list[int]) -> Any:
        """Run a whole model, or one pipeline stage, on the positions `positions` of each sample
        (the cp rank's share, in that order), its attention by `attention` (called as torch's
        scaled_dot_product_attention, causal: runner/layouts/context/ring.py)."""
        raise NotImplementedError(f"model {self.name} has no sequence to split over parallel.cp")

    # --- activation recomputation ---
    def recompute_units(self, model: Any) -> list[Any]:
        """The modules trainer.recompute wraps (runner/models/recompute.py): none, the model is
        too small to gain from it."""
        return []


@dataclass(frozen=True)
class ModelSpec(PlannedModel, RunningModel):
    """A model as the runner knows it: its name and schema, the planner's half and the running
    layout's half (a model's spec subclasses this and overrides what its model supports)."""

    name: str  # the option in conf/model/
    config: type  # its dataclass schema, whose `_target_` names the module

    @property
    def target(self) -> str:
        return self.config._target_


def matches_data(value: int, key: str, data: Cfg, data_key: str, train: bool) -> None:
    """A vector model's width must be its data's (the worked examples bring their own inputs)."""
    expected = data.get(data_key, 0)
    if train and expected:
        require(value == expected, key, f"{value} does not match data.{data_key}={expected}")
