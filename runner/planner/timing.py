"""A step's time from the hardware profile: compute at the device's FLOP/s, stretched by the
pipeline bubble, plus every dimension's communication on its tier, plus the fixed step cost.

Compute: the model's FLOPs per token as its spec counts them (6 per parameter and token, forward 2
and backward 4, Kaplan et al. 2020; the decoder's attention scores besides), on the busiest rank
(what tensor parallelism leaves whole, the last stage's output layer, count in full).
Communication is counted as exposed (no overlap with compute): an upper bound on GPUs, close on CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from runner.job import Job
from runner.layouts.pipeline.traffic import pipeline_bubble
from runner.layouts.traffic import Traffic
from runner.planner.hardware import flops_per_device, tier, transfer_s
from runner.precision import precision_of


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


def model_flops_per_step(job: Job) -> float:
    return job.spec.flops_per_token(job.model, job.data) * job.batch_size * job.tokens_per_sample


def rank_flops_per_step(job: Job) -> float:
    """The busiest rank's FLOPs in a step. Data parallelism splits the batch; the model's spec
    says what tensor parallelism splits; stages hold their own layers."""
    mesh = job.mesh
    tokens = job.batch_size * job.tokens_per_sample / mesh.dp
    per_token = job.spec.stage_flops_per_token(job.model, job.data, job.stages, mesh.tp)
    per_stage = [flops * tokens for flops in per_token]
    return max(sum(per_stage[r :: mesh.pp]) for r in range(mesh.pp))


def split_layer_passes(job: Job) -> float:
    """Tensor-parallel layers one rank runs forward and backward in a step (per micro-batch)."""
    if job.mesh.tp < 2:
        return 0.0
    passes = job.spec.split_layer_passes(job.model, job.stages)
    return passes * job.microbatches / job.mesh.pp


def step_time(job: Job, traffic: Traffic) -> StepTime:
    hw, mesh = job.hardware, job.mesh
    compute = rank_flops_per_step(job) / flops_per_device(hw, precision_of(job.trainer).compute)
    bubble = pipeline_bubble(job)
    comm = {}
    for dim, payload in traffic.payload.items():
        n = getattr(mesh, dim)
        # A ring all-reduce puts 2(n-1)/n of the payload on the wire; P2P sends all of it.
        wire = payload if dim == "pp" else 2 * (n - 1) / n * payload
        comm[dim] = transfer_s(tier(hw, mesh, dim), traffic.calls[dim], wire)
    overhead = hw.step_overhead_s + split_layer_passes(job) * hw.tp_layer_overhead_us * 1e-6
    # The bubble is the share of the whole pipelined step a stage waits: b = idle / (work + idle).
    return StepTime(compute, compute * bubble / (1 - bubble), comm, overhead)
