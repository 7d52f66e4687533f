"""A step's time from the hardware profile: the busiest rank's matrix products at the speed their
shapes reach (runner/planner/gemm.py), plus the pipeline's fill and drain, plus each
dimension's communication that compute does not hide, plus the software's fixed costs (stretched
where a CPU host's processes outnumber its cores).

Compute: every forward product of the rank's stages, three times (forward, the input and the
weight gradients), four for the blocks under full recomputation, per micro-batch; over the
profile's compute_efficiency (the share of compute time matrix products take). The model's FLOPs
for MFU are counted apart (6 per parameter and token, Kaplan et al. 2020; attention besides).
Communication: tensor-parallel and pipeline transfers sit between the computations that need
them, so all of their time counts. DDP all-reduces a bucket while backward computes the next, so
data-parallel time shows only where it outlasts the last micro-batch's backward, and never less
than the last bucket's, which starts when backward ends.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from runner.job import Job
from runner.layouts.traffic import Traffic
from runner.planner import gemm
from runner.planner.hardware import device_share, software_stretch, tier, transfer_s
from runner.precision import precision_of


@dataclass
class StepTime:
    compute_s: float  # one device's share of the work, bubble excluded
    bubble_s: float
    comm_s: dict[str, float]  # what each dimension's transfers add to the step (exposed)
    overhead_s: float
    links: dict[str, str] = field(default_factory=dict)  # the tier each dimension crosses
    hidden_s: dict[str, float] = field(default_factory=dict)  # transfers compute hides

    @property
    def total_s(self) -> float:
        return self.compute_s + self.bubble_s + sum(self.comm_s.values()) + self.overhead_s

    @property
    def idle_fraction(self) -> float:
        return 1 - self.compute_s / self.total_s if self.total_s else 0.0

    @property
    def parts(self) -> dict[str, float]:
        """The step's time by what spends it: compute, the bubble, each dimension's link."""
        return {"compute": self.compute_s, "bubble": self.bubble_s, **self.comm_s} | {
            "overhead": self.overhead_s
        }

    @property
    def bound(self) -> str:
        """What takes the largest share of the step, a link by its dimension and name."""
        parts = self.parts
        part = max(parts, key=parts.__getitem__)
        return f"{part} link ({self.links[part]})" if part in self.links else part


def model_flops_per_step(job: Job) -> float:
    return job.spec.flops_per_token(job.model, job.data) * job.batch_size * job.tokens_per_sample


@dataclass(frozen=True)
class Rates:
    """What one device reaches at the job's precision: peak FLOP/s, the profile's curve, memory
    bandwidth (bytes/s; None: no roofline), bytes per element. A CPU's devices share the host."""

    peak: float
    curve: list[list[float]]
    bandwidth: float | None
    elem: int

    @classmethod
    def of(cls, job: Job) -> Rates:
        hw, precision = job.hardware, precision_of(job.trainer)
        share = device_share(hw)
        bandwidth = hw.memory_bandwidth_gbs
        return cls(
            peak=hw.peak_tflops[precision.compute] * 1e12 / share,
            curve=list(hw.gemm_efficiency.get(precision.compute, [])),
            bandwidth=bandwidth * 1e9 / share if bandwidth else None,
            elem=precision.activation_bytes,
        )


def micro_samples(job: Job) -> int:
    return job.batch_size // (job.mesh.dp * job.microbatches)


def stage_s(job: Job, index: int, rates: Rates) -> float:
    """One micro-batch through one stage on one tensor rank: forward, backward, recomputation."""
    full = job.trainer.recompute == "full"
    layers, last = job.stages[index], index == len(job.stages) - 1
    vocab_tp = job.parallel.vocab_parallel and job.mesh.tp > 1
    products = job.spec.stage_gemms(
        job.model, job.data, layers, last, micro_samples(job), job.mesh.tp, vocab_tp
    )
    if products is None:  # shapes unknown: the FLOPs at the curve's best
        per_token = job.spec.stage_flops_per_token(job.model, job.data, job.stages, job.mesh.tp)
        flops = per_token[index] * micro_samples(job) * job.tokens_per_sample * (1 + full / 3)
        return flops / (rates.peak * gemm.curve_share(rates.curve, float("inf")))
    return sum(
        gemm.seconds(g, rates.peak, rates.curve, rates.bandwidth, rates.elem)
        * (3 + (full and g.recomputed))
        for g in products
    )


def rank_products_s(job: Job, rates: Rates) -> list[float]:
    """Each pipeline rank's matrix products for one micro-batch: stage s sits on rank s % pp."""
    pp = job.mesh.pp
    per_stage = [stage_s(job, i, rates) for i in range(len(job.stages))]
    return [sum(per_stage[r::pp]) for r in range(pp)]


def products_s(job: Job, rates: Rates) -> float:
    """The busiest rank's matrix products in a step."""
    return max(rank_products_s(job, rates)) * job.microbatches


def compute_s(job: Job) -> tuple[float, float]:
    """The busiest rank's compute in a step, and the pipeline's fill and drain: the busiest rank
    waits while the other ranks run a micro-batch each, once (v times faster with v virtual
    stages a rank). With even stages that is the bubble (p - 1)/(v*m + p - 1) of the step; a
    lighter stage (the decoder's first, without the output layer) leaves a shorter one."""
    per_rank = [t / job.hardware.compute_efficiency for t in rank_products_s(job, Rates.of(job))]
    busiest = max(per_rank)
    fill_and_drain = (sum(per_rank) - busiest) / job.parallel.virtual_stages
    return busiest * job.microbatches, fill_and_drain if job.mesh.pp > 1 else 0.0


def split_layer_passes(job: Job) -> float:
    """Tensor-parallel layers one rank runs forward and backward in a step (per micro-batch)."""
    if job.mesh.tp < 2:
        return 0.0
    passes = job.spec.split_layer_passes(job.model, job.stages)
    passes += job.spec.vocab_split_passes(job.model) if job.vocab_tp else 0
    return passes * job.microbatches / job.mesh.pp


def wire_bytes(dim: str, payload: float, n: int) -> float:
    """A ring all-reduce puts 2(n-1)/n of the payload on the wire; P2P sends all of it."""
    return payload if dim == "pp" else 2 * (n - 1) / n * payload


def comm_s(job: Job, traffic: Traffic, compute: float) -> tuple[dict[str, float], dict[str, float]]:
    """Each dimension's exposed time, and what compute hides of it (data parallelism only)."""
    hw, mesh = job.hardware, job.mesh
    exposed, hidden = {}, {}
    for dim, payload in traffic.payload.items():
        n, link = getattr(mesh, dim), tier(hw, mesh, dim)
        total = transfer_s(link, traffic.calls[dim], wire_bytes(dim, payload, n))
        exposed[dim] = total
        if dim == "dp" and dim in traffic.tail:
            last = transfer_s(link, 1, wire_bytes(dim, traffic.tail[dim], n))
            backward = compute * backward_share(job) / job.microbatches  # the last micro-batch's
            exposed[dim] = max(last, total - backward)
            hidden[dim] = total - exposed[dim]
    return exposed, hidden


def backward_share(job: Job) -> float:
    """Backward's share of a step's compute: 2 of 3 passes, 3 of 4 recomputing a forward."""
    return 3 / 4 if job.trainer.recompute == "full" else 2 / 3


def step_time(job: Job, traffic: Traffic) -> StepTime:
    hw, mesh = job.hardware, job.mesh
    compute, bubble = compute_s(job)
    exposed, hidden = comm_s(job, traffic, compute)
    software = hw.step_overhead_s + split_layer_passes(job) * hw.tp_layer_overhead_us * 1e-6
    links = {dim: tier(hw, mesh, dim).name for dim in exposed}
    return StepTime(compute, bubble, exposed, software * software_stretch(hw), links, hidden)
