"""A step's time from the hardware profile: the busiest rank's matrix products at the speed their
shapes reach (runner/planner/gemm.py), plus the pipeline's fill and drain, plus each
dimension's communication that compute does not hide, plus the software's fixed costs (stretched
where a CPU host's processes outnumber its cores).

Compute: every forward product of the rank's stages, three times (forward, the input and the
weight gradients), four for the blocks under full recomputation, per micro-batch; attention's
as its kernel runs them (runner/planner/attention.py: a fused kernel computes the causal half
and Q K^T again in backward); over the profile's compute_efficiency (the share of compute time
matrix products take). The model's FLOPs for MFU are counted apart (6 per parameter and token,
Kaplan et al. 2020; attention besides).
Communication: tensor-parallel and pipeline transfers sit between the computations that need
them, so all of their time counts (over gloo, a pipeline's on the step's path; an interleaved
pipeline's on NCCL but its fill and drain hide behind its other stages' compute: pipeline_s),
and so does the sum of a tied weight's gradient between a pipeline's ends. DDP all-reduces a bucket
while backward computes the next, so data-parallel time shows only where it outlasts the last
micro-batch's backward, and never less than the last bucket's, which starts when backward ends;
over a CPU host's loopback whose cores all compute nothing hides it, and DDP's own cost per MB
(hardware.ddp_overhead_us_per_mb) adds whole.
Sharded data parallelism (parallel.shard, runner/layouts/sharded/traffic.py; ZeRO-1 runs as
ZeRO-2): FSDP's gathers before the first layer
computes (the root's and the first layer's) and its last reduce-scatters (theirs, after
backward) whole, the rest hidden up to the compute beside them: the first micro-batch's forward
for forward all-gathers, the last one's backward for backward all-gathers and reduce-scatters;
ZeRO-3 resharding under gradient accumulation does all that in every micro-batch, beside each.
Context parallelism's ring sends keys and values while attention computes on the ones it holds
(runner/layouts/context/ring.py): its time shows where it outlasts the attention's products,
forward and backward.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from runner.job import Job
from runner.layouts.context.traffic import ring_phases
from runner.layouts.pipeline.traffic import message_bytes, tied_bytes, tied_share
from runner.layouts.sharded.traffic import Collective, collectives, rounds
from runner.layouts.traffic import Traffic
from runner.memo import shared, stage_key, stages_key
from runner.mesh import P2P_DIMS
from runner.planner import gemm
from runner.planner.attention import backward_passes, computed_share
from runner.planner.hardware import (
    copies_on_busy_cores,
    device_share,
    software_stretch,
    tier,
    transfer_s,
)
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
    bandwidth (bytes/s; None: no roofline), bytes per element. A CPU's devices share the host.
    `linear`: the blocks' linear layers' own peak and curve where they run in another format
    (fp8); None: at `peak`."""

    peak: float
    curve: tuple[tuple[float, ...], ...]
    bandwidth: float | None
    elem: int
    linear: tuple[float, tuple[tuple[float, ...], ...]] | None = None

    @classmethod
    def of(cls, job: Job) -> Rates:
        hw, precision = job.hardware, precision_of(job.trainer)
        share = device_share(hw)
        bandwidth = hw.memory_bandwidth_gbs

        def at(key: str) -> tuple[float, tuple[tuple[float, ...], ...]]:
            # a format without its own curve (fp8) reaches the share of peak the job's does
            curve = hw.gemm_efficiency.get(key) or hw.gemm_efficiency.get(precision.compute, [])
            return hw.peak_tflops[key] * 1e12 / share, tuple(map(tuple, curve))

        peak, curve = at(precision.compute)
        return cls(
            peak=peak,
            curve=curve,
            bandwidth=bandwidth * 1e9 / share if bandwidth else None,
            elem=precision.activation_bytes,
            linear=at(precision.linear_compute) if precision.linear_compute else None,
        )

    def seconds(self, g: Any) -> float:
        """One product's time: a block's linear layer (recomputed, not attention's) at the
        linear layers' rate, the rest (attention's, the output layer) at the job's."""
        linear = self.linear is not None and g.recomputed and not g.attention
        peak, curve = self.linear if linear else (self.peak, self.curve)
        return gemm.seconds(g, peak, curve, self.bandwidth, self.elem)


def micro_samples(job: Job) -> int:
    return job.batch_size // (job.mesh.dp * job.microbatches)


@shared(
    key=lambda job, index, rates: stage_key(
        job, index, micro_samples(job), job.mesh.cp, job.trainer.recompute, rates
    )
)
def stage_s(job: Job, index: int, rates: Rates) -> float:
    """One micro-batch through one stage on one tensor rank: forward, backward, recomputation."""
    full = job.trainer.recompute == "full"
    products = stage_products(job, index)
    if products is None:  # shapes unknown: the FLOPs at the curve's best
        per_token = job.spec.stage_flops_per_token(job.model, job.data, job.stages, job.mesh.tp)
        flops = per_token[index] * micro_samples(job) * job.tokens_per_sample * (1 + full / 3)
        return flops / (rates.peak * gemm.curve_share(rates.curve, float("inf")))
    return sum(
        rates.seconds(g)
        * computed_share(job, g)
        * (1 + backward_passes(job, g) + (full and g.recomputed))
        for g in products
    )


@shared(key=lambda job, index: stage_key(job, index, micro_samples(job), job.mesh.cp))
def stage_products(job: Job, index: int) -> list[Any] | None:
    """One micro-batch's matrix products through one stage on one rank (None: shapes unknown).
    A context-parallel rank's are its positions' (a spec's `cp` only where it runs)."""
    layers, last = job.stages[index], index == len(job.stages) - 1
    vocab_tp = job.parallel.vocab_parallel and job.mesh.tp > 1
    cp = {"cp": job.mesh.cp} if job.mesh.cp > 1 else {}
    return job.spec.stage_gemms(
        job.model, job.data, layers, last, micro_samples(job), job.mesh.tp, vocab_tp, **cp
    )


def attention_s(job: Job) -> tuple[float, float]:
    """The busiest pipeline rank's attention products in a step, forward and backward (as its
    kernel runs them: runner/planner/attention.py): what a ring attention's exchanges run
    beside."""
    per_rank = rank_attention_s(job, Rates.of(job))
    scale = job.microbatches / job.hardware.compute_efficiency
    forward, backward = max(per_rank, key=lambda passes: sum(passes))
    return forward * scale, backward * scale


def per_micro_batch(job: Job, rates: Rates) -> tuple[Any, ...]:
    """What a rank's products for one micro-batch depend on."""
    return stages_key(job, micro_samples(job), job.mesh.cp, job.trainer.recompute, rates)


@shared(key=per_micro_batch)
def rank_attention_s(job: Job, rates: Rates) -> list[tuple[float, float]]:
    """Each pipeline rank's attention products for one micro-batch, forward and backward."""

    forward, backward = [], []
    for i in range(len(job.stages)):
        timed = [(rates.seconds(g) * computed_share(job, g), g)
                 for g in stage_products(job, i) or [] if g.attention]  # fmt: skip
        forward.append(sum(t for t, _ in timed))
        backward.append(sum(t * backward_passes(job, g) for t, g in timed))
    return list(zip(by_rank(job, forward), by_rank(job, backward), strict=True))


def by_rank(job: Job, per_stage: list[float]) -> list[float]:
    """Each pipeline rank's sum of its stages' figures: stage s sits on rank s % pp."""
    return [sum(per_stage[r :: job.mesh.pp]) for r in range(job.mesh.pp)]


@shared(key=per_micro_batch)
def rank_products_s(job: Job, rates: Rates) -> list[float]:
    """Each pipeline rank's matrix products for one micro-batch."""
    return by_rank(job, [stage_s(job, i, rates) for i in range(len(job.stages))])


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


def wire_bytes(dim: str, payload: float, n: int, collective: str = "all_reduce") -> float:
    """Bytes on each rank's link for a payload S (nccl-tests' bus bytes): a ring all-reduce
    2(n-1)/n S, an all-gather or a reduce-scatter (n-1)/n S; P2P sends all of it."""
    if dim in P2P_DIMS:
        return payload
    ring = 2 if collective == "all_reduce" else 1
    return ring * (n - 1) / n * payload


def dp_wire_bytes(job: Job, traffic: Traffic) -> float:
    """Data parallelism's bytes on each rank's link, its collectives each priced as they run."""
    n, named = job.mesh.size("dp"), traffic.by_collective
    if not named:
        return wire_bytes("dp", traffic.payload.get("dp", 0.0), n)
    return sum(wire_bytes("dp", s, n, key.split("/")[1]) for key, s in named.items())


def comm_s(job: Job, traffic: Traffic, compute: float) -> tuple[dict[str, float], dict[str, float]]:
    """Each dimension's exposed time, and what compute hides of it (data, context and
    interleaved pipeline parallelism)."""
    hw, mesh = job.hardware, job.mesh
    exposed, hidden = {}, {}
    for dim, payload in traffic.payload.items():
        n, link = mesh.size(dim), tier(hw, mesh, dim)
        if dim == "dp" and job.shard != "none":
            exposed[dim], hidden[dim] = sharded_s(job, compute)
            continue
        # sequence parallelism's all-gathers and reduce-scatters, and expert parallelism's
        # all-to-alls: (n-1)/n of their payload each
        kind = {"sp": "all_gather", "ep": "all_to_all"}.get(dim, "all_reduce")
        total = transfer_s(link, traffic.calls[dim], wire_bytes(dim, payload, n, kind))
        exposed[dim] = total
        if dim == "dp" and dim in traffic.tail:
            exposed[dim], hidden[dim] = ddp_s(job, total, traffic.tail[dim], compute, payload)
        if dim == "cp":  # the ring's sends run beside attention's products
            exposed[dim] = ring_s(job, link)
            hidden[dim] = total - exposed[dim]
        if dim == "pp":
            exposed[dim], hidden[dim] = pipeline_s(job, link, traffic, compute)
    return exposed, hidden


def pipeline_s(job: Job, link: Any, traffic: Traffic, compute: float) -> tuple[float, float]:
    """A pipeline's transfers on the step's path, and the first and last stage's sum of a tied
    weight's gradient. NCCL's sends: a rank's own, each between the computations that need it;
    but under an interleaved schedule (virtual stages) torch's runtime posts each receive as soon
    as its sender computes and never waits on a send, and a rank has its other stages' work to do
    meanwhile (Megatron-LM's overlap_p2p_comm, Llama 3's asynchronous sends): only the fill's and
    the drain's transfers, one per boundary each way, stay on the path, and the rest where it
    outlasts the step's compute. Returns the time exposed and the time hidden.
    Gloo's: a TCP pair carries a send only once its peer has posted the receive, and that notice
    waits behind what the peer is sending the other way; so a boundary's transfers run one after
    another, both ways (measured at 40 Mbit/s: 52 ms each for 262 kB, 2m of them a step): the
    busiest boundary's 2m, and the others' first forward and last backward."""
    tied, sums = tied_share(job)
    sent, calls = traffic.payload["pp"] - tied, traffic.calls["pp"] - sums
    tied_s = transfer_s(link, 1, tied_bytes(job)) if tied else 0.0
    messages = message_bytes(job)
    if job.hardware.accelerator == "cpu":
        m = job.parallel.microbatches
        share = sent / (2 * m * sum(messages) / job.mesh.pp)  # 1/tp under plan.scatter_gather
        calls = 2 * (m + len(messages) - 1)
        sent = calls * max(messages) * share
    elif job.parallel.virtual_stages > 1:
        hops = 2 * (job.mesh.pp - 1)
        share = sent / (2 * job.parallel.microbatches * sum(messages) / job.mesh.pp)
        every = transfer_s(link, calls, sent)  # few micro-batches: fewer sends than the path
        path = min(every, transfer_s(link, hops, hops * max(messages) * share))
        rest = every - path
        return path + max(0.0, rest - compute) + tied_s, min(rest, compute)
    return transfer_s(link, calls, sent) + tied_s, 0.0


def ring_s(job: Job, link: Any) -> float:
    """A ring attention's exposed time: each pass's sends where they outlast the attention
    products beside them (forward's, recomputation's again, and backward's: the gradients' two
    of each forward product's size and the scores computed again), and every block's last
    exchange of gradients, which nothing computes beside."""
    forward, backward, last = (transfer_s(link, calls, sent) for sent, calls in ring_phases(job))
    full = job.trainer.recompute == "full"
    beside_forward, beside_backward = attention_s(job)
    return max(0.0, forward - beside_forward * (1 + full)) + max(last, backward - beside_backward)


def ddp_s(
    job: Job, total: float, tail: float, compute: float, payload: float
) -> tuple[float, float]:
    """DDP's all-reduce time exposed and hidden: all but its last bucket hides behind the last
    micro-batch's backward, save over a CPU host's loopback whose cores all compute, where
    nothing hides it (copies_on_busy_cores). Its runtime's own cost for the payload's MB
    (hardware.ddp_overhead_us_per_mb) adds to the step whole."""
    hw, n = job.hardware, job.mesh.size("dp")
    software = payload / 1e6 * hw.ddp_overhead_us_per_mb * 1e-6
    if copies_on_busy_cores(hw, job.mesh, "dp"):
        return total + software, 0.0
    last = transfer_s(tier(hw, job.mesh, "dp"), 1, wire_bytes("dp", tail, n))
    backward = compute * backward_share(job) / job.microbatches  # the last micro-batch's
    exposed = max(last, total - backward)
    return exposed + software, total - exposed


def sharded_s(job: Job, compute: float) -> tuple[float, float]:
    """Sharded data parallelism's time exposed and hidden (the module's docstring)."""
    n, link = job.mesh.size("dp"), tier(job.hardware, job.mesh, "dp")
    own = collectives(job)

    def seconds(c: Collective, calls: float, payload: float) -> float:
        return transfer_s(link, calls, wire_bytes("dp", payload, n, c.name))

    exposed = hidden = 0.0
    # What they run beside: one micro-batch's passes, or each micro-batch's (ZeRO-3 resharding
    # gathers and reduce-scatters in every one)
    passes = compute * rounds(job) / job.microbatches
    beside = {
        "forward": passes * (1 - backward_share(job)),
        "backward": passes * backward_share(job),
    }
    for during in ("forward", "backward", "after"):
        mine = [c for c in own if c.during == during]
        total = sum(seconds(c, c.calls, c.payload) for c in mine)
        edge = sum(seconds(c, c.edge_calls, c.edge) for c in mine)
        shown = edge + max(0.0, total - edge - beside.get(during, 0.0))  # "after": no compute
        exposed, hidden = exposed + shown, hidden + total - shown
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
