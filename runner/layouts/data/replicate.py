"""Data parallelism's part of a mesh: the model (or a pipeline stage, split over tp or not)
replicated over the mesh's dp dimension by torch's DDP, which averages gradients between replicas
only, never between the shards of one layer; its gradient buckets probed. With context
parallelism a replica's cp ranks, which hold the same weights and each a part of its samples'
positions, average with them: DDP runs over dp and cp flattened into one dimension."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from runner.compat.ddp_dtensor import leave_to_others, localized_shards, shard_spec
from runner.layouts.data.probe import hook_buckets
from runner.layouts.layout import LocalShard
from runner.layouts.probes import Recorder


class Replication:
    def __init__(self, bucket_cap_mb: float | None) -> None:
        self.bucket_cap_mb = bucket_cap_mb
        self.replicas: list[DistributedDataParallel] = []  # their buckets are probed
        # Every tensor-parallel parameter that DDP turned into a plain local tensor: snapshots
        # show them as DTensors (runner/snapshots.py).
        self.localized: list[LocalShard] = []

    def apply(
        self, module: nn.Module, mesh: DeviceMesh, device: torch.device, others: list[str]
    ) -> nn.Module:
        """`module` wrapped in DDP over `mesh` (1-D: the replicas', with their cp ranks), but for
        the parameters named in `others` (the experts, whose gradients expert parallelism sums)."""
        gpu = device.type == "cuda"
        if others:
            leave_to_others(module, others)
        split = any(isinstance(p, DTensor) for p in module.parameters())
        replica = DistributedDataParallel(
            module,
            device_ids=[device.index] if gpu else None,
            device_mesh=mesh,
            bucket_cap_mb=self.bucket_cap_mb,
            # the decoder's fixed positions differ: each context-parallel rank holds its own
            broadcast_buffers=False,
        )
        self.replicas.append(replica)
        # DDP keeps each DTensor shard as a plain local tensor (runner/compat/ddp_dtensor.py);
        # after the first forward the module lists none of them. The optimizer holds these
        # tensors: a snapshot needs them.
        for name, param in localized_shards(module, split):
            owner, _, attr = name.rpartition(".")
            self.localized.append(
                LocalShard(module.get_submodule(owner), attr, param, shard_spec(param))
            )
        return replica

    def held(self, weight: nn.Parameter) -> nn.Parameter:
        """The parameter the optimizer steps for a module's weight: over tensor-parallel shards,
        the local tensor DDP keeps in the DTensor's place (its gradient is there)."""
        for shard in self.localized:
            if getattr(shard.owner, shard.attr, None) is weight:
                return shard.param
        return weight

    def install_probes(self, record: Recorder) -> None:
        for replica in self.replicas:
            hook_buckets(replica, record)
