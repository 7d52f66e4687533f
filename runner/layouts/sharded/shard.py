"""Sharded data parallelism on the mesh's dp dimension (with its cp ranks, which sum gradients
with the replicas: torchtitan's dp_shard_cp), by torch's own implementations.

- `optimizer` (ZeRO-1), `gradients` (ZeRO-2) and `full` (ZeRO-3, FSDP): FSDP2's `fully_shard` on
  each unit of the model (the spec's units: the decoder's blocks, the FFNN's Linear layers), then
  on the whole (the rest: the decoder's embedding). Gradients are reduce-scattered as backward
  makes them, and each replica's optimizer steps its shard. `full` frees a unit's gathered weights
  after its forward and gathers them again for its backward; `gradients` keeps them from forward
  to the end of backward. The whole's own weights are kept (backward needs the embedding first).
  With several micro-batches, `full` frees and gathers for each one outside a pipeline
  (runner/layouts/sharded/accumulation.py), as torchtitan does; a pipeline's stages keep the
  weights across its micro-batches, as `gradients` does (parallel.reshard_after_forward chooses).
- ZeRO-1 runs as ZeRO-2, as Megatron-LM's distributed optimizer does: gradients reduce-scattered,
  the updated weights all-gathered (before the next forward, or right after the step:
  parallel.param_gather), one all-reduce's bytes. Megatron keeps its whole gradient buffer
  besides (its buckets are views of it); FSDP2 frees each unit's once it is scattered.
Each unit asks for the next one's weights before it runs (prefetch: forward and backward); on a
CPU the gather runs in gloo's thread beside the rank's compute (`_set_unshard_async_op`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from runner.layouts.probes import Recorder
from runner.layouts.sharded import probe
from runner.precision import BY_NAME


def sixteen_bit(
    precision: str, grad_reduce: str, output: torch.dtype | None = torch.float32
) -> MixedPrecisionPolicy | None:
    """FSDP2's mixed precision for 16-bit weights over fp32 masters (runner/precision.py): its
    fp32 shards are the masters the optimizer steps; each unit's weights are gathered and computed
    in bf16, gradients reduced in `grad_reduce`; the model's output comes back in `output` (fp32
    for the loss; None: as computed, for a pipeline's stages, which cast what they send
    themselves). torchtitan's `mixed_precision_param`/`_reduce`. None: weights stay as they
    are."""
    if not BY_NAME[precision].masters:
        return None
    reduce = torch.bfloat16 if grad_reduce == "bf16" else torch.float32
    return MixedPrecisionPolicy(
        param_dtype=torch.bfloat16, reduce_dtype=reduce, output_dtype=output
    )


@dataclass(frozen=True)
class Nested:
    """Modules inside the units sharded over a mesh of their own first (a mixture of experts'
    experts, over the ranks that hold the same ones), their gradients' sum divided by
    `divide` (FSDP2 would divide by their mesh's size)."""

    modules: list[nn.Module]
    mesh: DeviceMesh
    divide: int


def shard_module(
    module: nn.Module,
    units: list[nn.Module],
    mesh: DeviceMesh,
    level: str,
    reshard: bool,
    policy: MixedPrecisionPolicy | None = None,
    nested: Nested | None = None,
) -> list[FSDPModule]:
    """FSDP2 over `mesh` (the dp dimension) on `units` (those inside `module`), then `module`, in
    `policy`'s precision; at level full, `reshard`: each unit's weights freed after its forward
    (runner/job.py: reshards_after_forward). Returns every FSDP module, the whole last."""
    inside = [u for u in units if any(u is m for m in module.modules())]
    free = level == "full" and reshard
    # The units hand each other 16 bits; the whole's output alone comes back in the policy's
    mixed = {"mp_policy": replace(policy, output_dtype=None)} if policy is not None else {}
    # before their units: FSDP2 leaves a nested FSDP module's weights to it
    own = shard_nested(nested, module, free, mixed) if nested is not None else []
    for unit in inside:
        fully_shard(unit, mesh=mesh, reshard_after_forward=free, **mixed)
    whole = {"mp_policy": policy} if policy is not None else {}
    fully_shard(module, mesh=mesh, reshard_after_forward=False, **whole)
    for before, after in zip(inside, inside[1:], strict=False):
        before.set_modules_to_forward_prefetch([after])
        after.set_modules_to_backward_prefetch([before])
    if inside:
        # The first unit's too (the whole, gathered by then: nothing moves). Left implicit, FSDP
        # would prefetch by the order of forwards since the last backward, which an evaluation's
        # forwards lengthen: the first backward after one gathered a unit twice.
        inside[0].set_modules_to_backward_prefetch([module])  # type: ignore[list-item]
    gather_beside_compute(module)
    return [*own, *inside, module]  # type: ignore[list-item]


def shard_nested(
    nested: Nested, module: nn.Module, free: bool, mixed: dict[str, Any]
) -> list[FSDPModule]:
    """`nested`'s modules inside `module`, each over its own mesh, their gradients' sum divided
    by `nested.divide`."""
    inside = [m for m in nested.modules if any(m is x for x in module.modules())]
    for inner in inside:
        fully_shard(inner, mesh=nested.mesh, reshard_after_forward=free, **mixed)
        inner.set_gradient_divide_factor(nested.divide)
        # gloo has no pre-multiplied sum: divide apart, then sum
        inner.set_force_sum_reduction_for_comms(nested.mesh.device_type == "cpu")
    return inside  # type: ignore[return-value]


def gather_beside_compute(module: nn.Module) -> None:
    """On a CPU, FSDP's all-gathers return at once: gloo runs them in its own thread, beside the
    rank's compute. A private setter of torch's: where a release lacks it, they return when
    done, and nothing is prefetched behind compute."""
    setter = getattr(module, "_set_unshard_async_op", None)
    if setter is not None and next(module.parameters()).device.type == "cpu":
        setter(True)


class Sharding:
    """Sharding's part of a mesh: data-parallel replicas that split their state over the mesh's
    dp dimension (and cp's), at one level (parallel.shard): FSDP2 shards the model's units (the
    spec's, found in the whole model before it is split) in DDP's place. `optimizer` runs as
    `gradients` (runner/job.py: resolved_shard). Over 16-bit weights (`policy`) FSDP2 runs on
    one replica too: its shards are the fp32 masters."""

    def __init__(
        self,
        level: str,
        units: Callable[[nn.Module], list[nn.Module]],
        policy: MixedPrecisionPolicy | None = None,
        reshard: bool = True,
        after_step: bool = False,
    ) -> None:
        self.level, self.units, self.policy = level, units, policy
        self.after_step = after_step  # gather the updated weights right after the step
        self.frees = reshard and level == "full"  # ZeRO-3 frees weights after forward
        self.unit_list: list[nn.Module] = []
        self.fsdp: list[FSDPModule] = []  # every FSDP module made, each stage's whole last

    def find_units(self, model: nn.Module) -> None:
        """The units of the whole model, before a split or a stage hides what they are."""
        self.unit_list = self.units(model)

    def apply(
        self, module: nn.Module, replicas: DeviceMesh, nested: Nested | None = None
    ) -> nn.Module:
        """`module` sharded over the replicas (a 1-D mesh: dp, or dp x cp flattened; FSDP2 wraps
        it in place), `nested`'s modules over their own mesh."""
        self.fsdp += shard_module(
            module, self.unit_list, replicas, self.level, self.frees, self.policy, nested
        )
        return module

    def gather_after_step(self) -> None:
        """parallel.param_gather=step: every unit's updated weights gathered now, all of them
        (Megatron-LM's distributed optimizer without overlapping them with the next forward),
        which then finds them gathered."""
        if self.after_step:
            for module in self.fsdp:
                module.unshard()

    def reshard(self) -> None:
        """Free the weights an evaluation's forward gathered (no backward freed them), so that
        every training step gathers what the one before it did. Gathered after the step, they
        were all gathered before the evaluation, and the next step finds them so: nothing to
        free."""
        if self.after_step:
            return
        for module in self.fsdp:
            module.reshard()

    def install_probes(self, record: Recorder, gpu: bool) -> None:
        probe.install(self.fsdp, record, gpu=gpu)
