"""Expert parallelism's part of a mesh: each mixture-of-experts block's experts placed n_experts
/ ep to a rank, over ep ranks drawn from the data-parallel ones (Megatron-LM's and torchtitan's
way: ep divides dp), and the block's rows all-to-all to them and back (exchange.py).

The rest of the model is replicated as data parallelism replicates it, DDP averaging its
gradients over dp (and cp). The experts are not DDP's: a rank's experts saw the tokens of its
whole ep group through the all-to-all, so their gradients are already that group's sum; summed
over the other groups' replicas of the same experts (dp / ep of them, with their cp ranks) and
divided by dp x cp, they are the mean DDP gives the rest, one all-reduce a step. Under sharded
data parallelism FSDP2 does that sum instead: each block's experts are sharded over those
replicas first, the rest over every replica (`sharded`, as torchtitan does).

A snapshot sees a rank's experts as its part of the whole stack, a DTensor split on the experts'
dimension over the ep group (`shards`): any placement, or none, reads it back."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Shard

from runner import clock
from runner.layouts.expert import exchange
from runner.layouts.expert.exchange import ExpertExchange
from runner.layouts.layout import LocalShard
from runner.layouts.probes import Recorder, Transfer
from runner.layouts.sharded.shard import Nested
from runner.mesh import Mesh


@dataclass(frozen=True)
class Placed:
    """A DTensor's spec, as a snapshot asks for it (runner/snapshots.py: as_dtensor)."""

    mesh: DeviceMesh
    placements: tuple[Shard, ...]
    shape: torch.Size
    stride: tuple[int, ...]


class ExpertSplit:
    def __init__(self, spec: Any, shape: Mesh) -> None:
        self.spec, self.shape, self.ep = spec, shape, shape.ep
        self.params: list[nn.Parameter] = []  # this rank's experts' weights
        self.held: list[tuple[nn.Module, str, nn.Parameter]] = []  # and where each is held
        self.placed: list[LocalShard] = []  # as parts of the whole stacks, once asked for
        self.replicas: dist.ProcessGroup | None = None  # the ranks holding the same experts
        self.record: Recorder | None = None
        self.group: dist.ProcessGroup | None = None  # this rank's ep group, and its index in it
        self.index = 0
        self.by_fsdp = False  # FSDP2 shards the experts over their replicas and sums them

    def apply(self, module: nn.Module, global_rank: int) -> nn.Module:
        """`module`'s experts cut to this rank's; itself with one ep rank."""
        if self.ep == 1:
            return module
        if self.group is None:  # once, whatever the stages a rank holds
            self.group, self.index = self._groups(global_rank)
        group, index = self.group, self.index
        for block in self.spec.expert_layers(module):
            experts, mine = block.experts, block.n_experts // self.ep
            for name, p in list(experts.named_parameters(recurse=False)):
                local = nn.Parameter(p.detach()[index * mine : (index + 1) * mine].clone())
                setattr(experts, name, local)
                self.params.append(local)
                self.held.append((experts, name, local))
            fixed = block.capacity_factor is not None
            block.exchange = ExpertExchange(experts, group, self.ep, fixed)
        return module

    def sharded(self, module: nn.Module, device_type: str) -> Nested | None:
        """Under sharded data parallelism: `module`'s experts, to shard over the ranks holding
        the same ones (dp / ep of them, with their cp ranks), as torchtitan does; FSDP2 sums
        their gradients there, divided by dp x cp as DDP's mean divides the rest (the module's
        docstring). None with one ep rank: they are the replicas' like any weight."""
        if self.ep == 1:
            return None
        self.by_fsdp = True
        ranks = dist.get_process_group_ranks(self.replicas)
        mesh = DeviceMesh.from_group(self.replicas, device_type, mesh=ranks)
        modules = [block.experts for block in self.spec.expert_layers(module)]
        return Nested(modules, mesh, self.shape.size("dp"))

    def shards(self, device_type: str) -> list[LocalShard]:
        """This rank's experts as shards of the whole stacks: split on their first dimension
        over the ep group, the same on every replica of the group (a snapshot keeps one)."""
        if self.held and not self.placed:
            ranks = dist.get_process_group_ranks(self.group)
            mesh = DeviceMesh.from_group(self.group, device_type, mesh=ranks)
            for owner, attr, local in self.held:
                shape = torch.Size((local.shape[0] * self.ep, *local.shape[1:]))
                whole = Placed(mesh, (Shard(0),), shape, torch.empty(shape, device="meta").stride())
                self.placed.append(LocalShard(owner, attr, local, whole))
        return self.placed

    def names(self, module: nn.Module) -> list[str]:
        """The experts' parameter names in `module`: data parallelism leaves them alone."""
        mine = {id(p) for p in self.params}
        return [name for name, p in module.named_parameters() if id(p) in mine]

    def _groups(self, global_rank: int) -> tuple[dist.ProcessGroup, int]:
        """This rank's ep group and index in it; the replicas of its experts. Every rank takes
        part in creating every group, in the same order."""
        s, ep = self.shape, self.ep
        me = s.coords(global_rank)
        blocks = range(s.dp // ep)
        mine = None
        for pp, cp, tp, block in itertools.product(range(s.pp), range(s.cp), range(s.tp), blocks):
            ranks = [s.rank(pp, block * ep + i, tp, cp=cp) for i in range(ep)]
            group = dist.new_group(ranks)
            if global_rank in ranks:
                mine = group
        for pp, tp, i in itertools.product(range(s.pp), range(s.tp), range(ep)):
            ranks = [s.rank(pp, b * ep + i, tp, cp=c) for b in blocks for c in range(s.cp)]
            group = dist.new_group(ranks)
            if global_rank in ranks:
                self.replicas = group
        return mine, me["dp"] % ep

    def sync(self) -> None:
        """The experts' gradients: summed over their replicas, divided as DDP divides the rest."""
        grads = [p.grad for p in self.params if p.grad is not None]
        if not grads or self.by_fsdp:
            return
        flat = torch.cat([g.flatten() for g in grads])
        if dist.get_world_size(self.replicas) > 1:
            start = clock.stamp()
            dist.all_reduce(flat, group=self.replicas)
            if self.record is not None:
                nbytes = flat.numel() * flat.element_size()
                self.record(Transfer("dp", "all-reduce", start, clock.stamp(), nbytes))
        flat /= self.shape.size("dp")
        for g, part in zip(grads, flat.split([g.numel() for g in grads]), strict=True):
            g.copy_(part.view_as(g))

    def install_probes(self, record: Recorder) -> None:
        if self.ep > 1:
            exchange.install(record)
            self.record = record
