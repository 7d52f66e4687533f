"""A job resolved once, at the top, into typed pieces: the model's spec and fields, the data's
shape, the mesh, the layout's settings, the hardware profile, the trainer's and the plan's
settings. The planner and the fit
checks take this rather than the composed config, and ask each piece only what they need.

Resolve after the mesh (runner/mesh.py: `resolve`) and the hardware profile's completeness have
been checked: every size is a number then. Torch-free.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, TypeVar

from omegaconf import DictConfig, OmegaConf

from runner.config import HardwareConfig, ParallelConfig, PlanConfig, TrainerConfig
from runner.memo import shared, stage_key
from runner.mesh import Mesh, mesh_of
from runner.models.registry import spec_for
from runner.models.sizes import stage_layers
from runner.models.spec import ModelSpec

T = TypeVar("T")


@dataclass(frozen=True)
class Job:
    spec: ModelSpec
    model: dict[str, Any]  # the model's fields, as its spec reads them
    data: dict[str, Any]  # the data's fields: batch_size (global), seq_len for text, ...
    mesh: Mesh
    parallel: ParallelConfig
    hardware: HardwareConfig
    trainer: TrainerConfig
    plan: PlanConfig  # mode=plan's settings (dtype, recomputation, duration)
    stages: list[range]  # each pipeline stage's layers (one stage without a pipeline)
    # What jobs of one search share (runner/memo.py); None: nothing kept
    memo: dict[Any, Any] | None = field(default=None, compare=False, repr=False)

    @property
    def batch_size(self) -> int:
        return self.data["batch_size"]

    @property
    def microbatches(self) -> int:
        """Micro-batches a replica's share of the batch runs as: a pipeline's, or gradient
        accumulation's without one (a one-stage pipeline schedule)."""
        return self.parallel.microbatches

    @property
    def tokens_per_sample(self) -> int:
        return self.spec.tokens_per_sample(self.data)

    @property
    def vocab_tp(self) -> bool:
        """A model's vocabulary is split over the tensor-parallel ranks (parallel.vocab_parallel;
        a model without one ignores it)."""
        return self.parallel.vocab_parallel and self.mesh.tp > 1

    @property
    def sequence(self) -> bool:
        """The activations between a model's split layers split along its sequence over the
        tensor-parallel ranks (parallel.sequence_parallel)."""
        return self.parallel.sequence_parallel and self.mesh.tp > 1 and self.spec.sequence

    @shared(key=lambda job, index, experts=True: stage_key(job, index, experts))
    def stage_tensors(self, index: int, experts: bool = True) -> list[int]:
        """Stage `index`'s parameter tensors on one rank: its layers split over tp, a mixture of
        experts' experts over ep (`experts` false: without them, what DDP all-reduces)."""
        s, last = self.stages[index], len(self.stages) - 1
        placed = {"ep": self.mesh.ep, "experts": experts} if self.spec.experts else {}
        return self.spec.stage_tensors(
            self.model, s, index in (0, last), self.mesh.tp, self.vocab_tp, **placed
        )

    @property
    def shard(self) -> str:
        """What the data-parallel replicas split among themselves (parallel.shard): nothing
        without several replicas. With context parallelism their cp ranks, which sum gradients
        with them, shard too (torchtitan's dp_shard_cp). ZeRO-1 runs as ZeRO-2 does, as
        Megatron-LM's distributed optimizer: runner/layouts/sharded/shard.py."""
        return resolved_shard(self.parallel.shard, self.mesh.size("dp"))

    @property
    def gathers_after_step(self) -> bool:
        """The distributed optimizer gathers the updated weights right after its step
        (parallel.param_gather=step), not as the next forward reaches them."""
        return self.shard == "gradients" and self.parallel.param_gather == "step"

    @property
    def reshards(self) -> bool:
        """Whether ZeRO-3 frees each unit's weights after its forward and gathers them again for
        its backward (parallel.reshard_after_forward; default: outside a pipeline). Under
        gradient accumulation, then every micro-batch gathers and reduce-scatters."""
        return reshards_after_forward(self.shard, self.parallel.reshard_after_forward, self.mesh.pp)


def resolved_shard(shard: str, replicas: int) -> str:
    """parallel.shard as it runs over `replicas` (dp x cp) ranks: nothing to split over one;
    ZeRO-1 as ZeRO-2 (FSDP2 without resharding after forward: gradients reduce-scattered as
    backward makes them, the updated weights all-gathered, one all-reduce's bytes), which keeps
    no whole gradient once its reduce-scatter has run."""
    if replicas == 1:
        return "none"
    return "gradients" if shard == "optimizer" else shard


def reshards_after_forward(level: str, wanted: str, pp: int) -> bool:
    """ZeRO-3 (`level` full) frees each unit's weights after its forward: parallel.
    reshard_after_forward `wanted` always, or by default outside a pipeline (torchtitan's)."""
    return level == "full" and (wanted == "always" or (wanted == "default" and pp == 1))


def typed(schema: type[T], node: DictConfig) -> T:
    """The schema's dataclass from a config node (ranks get plain containers, not typed nodes).
    Resolved first, in place: an interpolation may point outside the node (`${parallel.pp}`)."""
    plain = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node
    # A copy of the one made for the same values: OmegaConf's checked merge costs 10-70 ms a
    # schema, and a sweep's jobs repeat all but their layout (repr tells 1, 1.0, True and "1" apart)
    return copy.deepcopy(_typed(schema, repr(plain), plain))


_TYPED: dict[tuple[type, str], Any] = {}  # (schema, repr of its values) -> the dataclass
TYPED_KEPT = 256  # a long sweep's layouts: the oldest go first


def _typed(schema: type[T], key: str, plain: Any) -> T:
    found = _TYPED.get((schema, key))
    if found is None:
        found = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), plain))
        if len(_TYPED) >= TYPED_KEPT:
            del _TYPED[next(iter(_TYPED))]
        _TYPED[(schema, key)] = found
    return found


@dataclass(frozen=True)
class Resolved:
    """What a rank asks of its job, resolved once where it starts (runner/training/rank.py:
    train) and handed to everything it builds: the mesh, the model's spec and the typed job
    (both None for a model of the user's: nothing to plan, no spec to split it by)."""

    mesh: Mesh
    spec: ModelSpec | None
    job: Job | None


def resolved(cfg: DictConfig) -> Resolved:
    job = resolve_job(cfg)
    return Resolved(job.mesh if job else mesh_of(cfg), job.spec if job else None, job)


def resolve_job(cfg: DictConfig) -> Job | None:
    """The job of a validated config; None for a model the registry does not know (the planner
    sizes the runner's own models only)."""
    spec = spec_for(cfg.model)
    if spec is None:
        return None
    return Job(
        spec=spec,
        model=OmegaConf.to_container(cfg.model, resolve=True),
        data=OmegaConf.to_container(cfg.data, resolve=True),
        mesh=mesh_of(cfg),
        parallel=typed(ParallelConfig, cfg.parallel),
        hardware=typed(HardwareConfig, cfg.hardware),
        trainer=typed(TrainerConfig, cfg.trainer),
        plan=typed(PlanConfig, cfg.plan),
        stages=stage_layers(cfg.model, cfg.parallel),
    )
