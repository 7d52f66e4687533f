"""Sharded data parallelism's traffic (parallel.shard), per rank and step, beside DDP's all-reduce
(runner/layouts/data/traffic.py, which keeps `none`). P: the bytes of the parameters a rank
holds, in what they are gathered or reduced in (a mean over pipeline ranks).

- gradients (ZeRO-2, and ZeRO-1, which runs as it: runner/job.py): P all-gathered in forward (or,
  with parallel.param_gather=step, right after the optimizer's step), P reduce-scattered in
  backward, one call of each per FSDP unit that holds parameters: each layer (the spec's
  recompute units: the decoder's blocks, the FFNN's Linear layers) and the stage's root (the
  rest: the decoder's tied embedding on the end stages; a model without units is all root).
- full (ZeRO-3): as gradients, and every unit but the root (whose weights stay gathered)
  all-gathered again for backward (parallel.reshard_after_forward, by default outside a
  pipeline). Under gradient accumulation every micro-batch does all of that: m times the bytes
  and calls. Kept instead (never; a pipeline's default), the weights stay gathered from the
  first forward to the last backward, and the step moves what gradients' does.

Payload S as nccl-tests names it: an all-gather's output, a reduce-scatter's input. FSDP pads a
tensor whose first dimension does not divide by dp; the padding is not counted. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import fmean

from runner.job import Job
from runner.layouts.traffic import Traffic
from runner.memo import shared, stage_key, stages_key
from runner.models.spec import ModelSpec
from runner.precision import precision_of


@dataclass(frozen=True)
class Units:
    """One stage's FSDP units on one tensor-parallel rank, in parameters: the root's own, all the
    layers', and each layer's alone, in forward order (a tensor-parallel FFNN pair's layer counts
    whole alone: an upper bound, used for the edge and the largest unit only). Under expert
    parallelism each block's experts are a unit of their own, sharded over the ranks holding the
    same ones; with one such rank they move nothing (`quiet`, and `quiet_units` of them)."""

    root: int
    inner: int
    layers: list[int]
    quiet: int = 0
    quiet_units: int = 0

    @property
    def total(self) -> int:
        return self.root + self.inner

    @property
    def moved(self) -> int:
        """What the units' collectives carry."""
        return self.total - self.quiet

    @property
    def edge(self) -> int:
        """The units gathered before the stage's first layer computes (and reduce-scattered
        after its backward ends): the root, and the first layer."""
        return self.root + (self.layers[0] if self.layers else 0)

    @property
    def edge_calls(self) -> int:
        return (self.root > 0) + bool(self.layers)

    @property
    def calls(self) -> int:
        """One collective per unit that holds parameters and shares them."""
        return (self.root > 0) + len(self.layers) - self.quiet_units


def alone_experts(job: Job) -> bool:
    """Whether a rank's experts have no replica to share them with (dp / ep = 1, and no cp)."""
    return job.mesh.ep > 1 and job.mesh.size("dp") // job.mesh.ep == 1


@shared(key=lambda job, index: stage_key(job, index, alone_experts(job)))
def units(job: Job, index: int) -> Units:
    """Stage `index`'s units. The root is what the stage holds beyond its layers (what `ends`
    adds: the decoder's tied embedding), or everything for a model without units."""
    spec, m, mesh, vocab_tp = job.spec, job.model, job.mesh, job.vocab_tp
    layers, last = job.stages[index], len(job.stages) - 1
    placed = {"ep": mesh.ep} if spec.experts else {}

    def params(span: range, ends: bool = False, **only: bool) -> int:
        return sum(spec.stage_tensors(m, span, ends, mesh.tp, vocab_tp, **placed, **only))

    whole = params(layers, index in (0, last))
    if type(spec).recompute_units is ModelSpec.recompute_units:  # no units: all root
        return Units(whole, 0, [])
    inner = params(layers)
    if mesh.ep == 1:
        return Units(whole - inner, inner, [params(range(i, i + 1)) for i in layers])
    alone, experts = [], []  # each block without its experts, then its experts
    for i in layers:
        block = params(range(i, i + 1), experts=False)
        experts.append(params(range(i, i + 1)) - block)
        alone += [block, experts[-1]]
    quiet = alone_experts(job)  # no replica to gather from or scatter to
    return Units(whole - inner, inner, alone, sum(experts) * quiet, len(experts) * quiet)


def regathers(job: Job) -> bool:
    """Whether backward gathers the layers' weights again (ZeRO-3 resharding after forward)."""
    return job.reshards


def rounds(job: Job) -> int:
    """How many times a step gathers and reduce-scatters: each micro-batch's, resharding."""
    return job.microbatches if regathers(job) else 1


@dataclass(frozen=True)
class Collective:
    """One kind of collective in one pass, per rank and step (means over pipeline ranks): bytes
    and calls, and `edge`/`edge_calls`, the part that runs while no compute does."""

    name: str  # all_gather | reduce_scatter
    during: str  # forward | backward | after (the step's compute)
    payload: float
    calls: float
    edge: float = 0.0
    edge_calls: float = 0.0


@shared(
    key=lambda job: stages_key(
        job,
        job.shard,
        rounds(job),
        regathers(job),
        job.gathers_after_step,
        alone_experts(job),
        precision_of(job.trainer),
    )
)
def collectives(job: Job) -> list[Collective]:
    """The sharded level's own collectives. Weights are gathered in what layers compute with,
    gradients scattered in what they are reduced in (runner/precision.py)."""
    shard, pp, precision = job.shard, job.mesh.pp, precision_of(job.trainer)
    gather, scatter = precision.weight_bytes, precision.grad_bytes
    if shard == "none":
        return []
    stages, m = [units(job, i) for i in range(len(job.stages))], rounds(job)
    total = sum(u.moved for u in stages) / pp * m
    calls = sum(u.calls for u in stages) / pp * m
    edge = fmean(u.edge for u in stages) * m  # one stage's: a rank starts one first
    edge_calls = fmean(u.edge_calls for u in stages) * m
    if job.gathers_after_step:  # all of them after the step, nothing computing beside
        gathered = Collective("all_gather", "after", total * gather, calls, total * gather, calls)
    else:
        gathered = Collective(
            "all_gather", "forward", total * gather, calls, edge * gather, edge_calls
        )
    out = [
        gathered,
        Collective(
            "reduce_scatter", "backward", total * scatter, calls, edge * scatter, edge_calls
        ),
    ]
    if regathers(job):  # every layer again, the root's weights kept
        again = sum(u.inner - u.quiet for u in stages) * gather / pp * m
        layers = sum(len(u.layers) - u.quiet_units for u in stages) / pp * m
        out.append(Collective("all_gather", "backward", again, layers))
    return out


def traffic(job: Job) -> Traffic:
    """The sharded collectives' dp payload and calls, each collective's bytes apart."""
    found = collectives(job)
    if not found:
        return Traffic()
    by_collective: dict[str, float] = {}
    for c in found:
        by_collective[f"dp/{c.name}"] = by_collective.get(f"dp/{c.name}", 0.0) + c.payload
    return Traffic(
        {"dp": sum(c.payload for c in found)},
        {"dp": sum(c.calls for c in found)},
        by_collective=by_collective,
    )
