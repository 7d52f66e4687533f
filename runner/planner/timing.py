"""A step's time from the hardware profile: compute at the device's FLOP/s, stretched by the
pipeline bubble, plus every dimension's communication on its tier, plus the fixed step cost.

Compute: 6 FLOPs per parameter and token (forward 2, backward 4; Kaplan et al. 2020) and, for the
decoder, 12 * layers * seq * d per token for the attention scores; the busiest rank's share of it
(what tensor parallelism leaves whole, the last stage's output layer, count in full).
Communication is counted as exposed (no overlap with compute): an upper bound on GPUs, close on CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import DictConfig

from runner.mesh import Mesh, mesh_of
from runner.models.sizes import column_row_pairs, param_count, stage_layers
from runner.planner.hardware import flops_per_device, tier, transfer_s
from runner.planner.traffic import (
    Traffic,
    bubble_fraction,
    decoder_block_params,
    is_decoder,
    widths,
)


@dataclass
class StepTime:
    compute_s: float  # one device's share of the work, bubble excluded
    bubble_s: float
    comm_s: dict[str, float]
    overhead_s: float

    @property
    def total_s(self) -> float:
        return self.compute_s + self.bubble_s + sum(self.comm_s.values()) + self.overhead_s

    @property
    def idle_fraction(self) -> float:
        return 1 - self.compute_s / self.total_s if self.total_s else 0.0


def tokens_per_sample(cfg: DictConfig) -> int:
    return cfg.data.seq_len if is_decoder(cfg.model) else 1


def model_flops_per_step(cfg: DictConfig) -> float:
    tokens = cfg.data.batch_size * tokens_per_sample(cfg)
    flops = 6 * (param_count(cfg.model) or 0) * tokens
    if is_decoder(cfg.model):
        m = cfg.model
        flops += 12 * m.n_layers * cfg.data.seq_len * m.d_model * tokens
    return flops


def rank_flops_per_step(cfg: DictConfig, mesh: Mesh) -> float:
    """The busiest rank's FLOPs in a step. Data parallelism splits the batch; tensor parallelism
    splits the blocks (and the FFNN's paired layers) but not the tied output layer, nor an odd
    layer, which every tensor rank of its stage computes whole; stages hold their own layers."""
    m, tokens = cfg.model, cfg.data.batch_size * tokens_per_sample(cfg) / mesh.dp
    stages = stage_layers(m, cfg.parallel)
    last = len(stages) - 1
    if is_decoder(m):
        block = 6 * decoder_block_params(m.d_model, 1) + 12 * cfg.data.seq_len * m.d_model
        head = 6 * m.vocab_size * m.d_model
        per_stage = [(len(s) * block / mesh.tp + head * (i == last)) * tokens
                     for i, s in enumerate(stages)]  # fmt: skip
    elif m.get("_target_", "").endswith("FFNN"):
        w = widths(m)
        per_stage = []
        for s in stages:
            split = {i for pair in column_row_pairs(s) for i in pair} if mesh.tp > 1 else set()
            per_stage.append(sum(
                6 * (w[i] * w[i + 1] + w[i + 1]) * tokens / (mesh.tp if i in split else 1)
                for i in s
            ))  # fmt: skip
    else:
        return model_flops_per_step(cfg) / mesh.world
    return max(sum(per_stage[r :: mesh.pp]) for r in range(mesh.pp))


def pipeline_bubble(cfg: DictConfig, mesh: Mesh) -> float:
    if mesh.pp < 2:
        return 0.0
    p = cfg.parallel
    return bubble_fraction(mesh.pp, p.microbatches, p.virtual_stages)


def split_layer_passes(cfg: DictConfig, mesh: Mesh) -> float:
    """Tensor-parallel layers one rank runs forward and backward in a step (per micro-batch)."""
    if mesh.tp < 2:
        return 0.0
    microbatches = cfg.parallel.microbatches if mesh.pp > 1 else 1
    if is_decoder(cfg.model):
        layers = 6 * cfg.model.n_layers  # Q, K, V, output; the FFN's two
    else:
        stages = stage_layers(cfg.model, cfg.parallel)
        layers = 2 * sum(len(column_row_pairs(s)) for s in stages)
    return layers * microbatches / mesh.pp


def step_time(cfg: DictConfig, traffic: Traffic, dtype: str = "fp32") -> StepTime:
    hw, mesh = cfg.hardware, mesh_of(cfg)
    compute = rank_flops_per_step(cfg, mesh) / flops_per_device(hw, dtype)
    bubble = pipeline_bubble(cfg, mesh)
    comm = {}
    for dim, payload in traffic.payload.items():
        n = getattr(mesh, dim)
        # A ring all-reduce puts 2(n-1)/n of the payload on the wire; P2P sends all of it.
        wire = payload if dim == "pp" else 2 * (n - 1) / n * payload
        comm[dim] = transfer_s(tier(hw, mesh, dim), traffic.calls[dim], wire)
    overhead = hw.step_overhead_s + split_layer_passes(cfg, mesh) * hw.tp_layer_overhead_us * 1e-6
    # The bubble is the share of the whole pipelined step a stage waits: b = idle / (work + idle).
    return StepTime(compute, compute * bubble / (1 - bubble), comm, overhead)
