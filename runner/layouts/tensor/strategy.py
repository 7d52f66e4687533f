"""A Lightning strategy for a (pp, dp, tp) device mesh: tensor parallelism, alone or with data
parallelism (and the base of the pipeline strategy, which adds the stages).

It reuses DDPStrategy's process group, ranks and reductions. Where DDP would wrap the whole
LightningModule, it splits the plain model over the mesh's tp dimension (the model spec's plan)
and, for several data-parallel replicas, wraps it in DDP over the mesh's dp dimension only: DDP
averages gradients between replicas, never between the shards of one layer.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import partial
from typing import Any

import torch.distributed as dist
from omegaconf import DictConfig
from pytorch_lightning.strategies import DDPStrategy
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from runner.compat.ddp_dtensor import localized_shards
from runner.launch import bind_gloo_to_loopback
from runner.layouts import backend, timeout
from runner.layouts.data.probe import hook_buckets
from runner.layouts.probes import Transfer
from runner.layouts.sharded import probe as sharded_probe
from runner.layouts.sharded.shard import ZeroOptimizer, shard_module, zero_optimizer
from runner.layouts.tensor import probe as collectives
from runner.mesh import DIMS, Mesh
from runner.models.registry import spec_for
from runner.models.spec import ModelSpec


class MeshStrategy(DDPStrategy):
    strategy_name = "mesh"
    microbatches = 1  # a pipeline's, or gradient accumulation's (the pipeline strategy's)

    def __init__(
        self,
        shape: Mesh,
        parallelize: Callable[[nn.Module, DeviceMesh], nn.Module],
        bucket_cap_mb: float | None = None,
        shard: str = "none",
        units: Callable[[nn.Module], list[nn.Module]] = lambda model: [],
        **kw: Any,
    ) -> None:
        # The runner launches the processes itself (runner.launch), or torchrun/SLURM does.
        super().__init__(start_method="popen", **kw)
        self.shape, self.bucket_cap_mb = shape, bucket_cap_mb
        self.parallelize = parallelize  # the model's tensor-parallel plan
        # parallel.shard (runner/layouts/sharded/), FSDP's units: the model spec's, found in the
        # whole model before it is split (`units` of it), and the FSDP modules made of them
        self.shard, self.units = (shard if shape.dp > 1 else "none"), units
        self.unit_list: list[nn.Module] = []
        self.fsdp: list[Any] = []
        self.device_mesh: DeviceMesh | None = None
        self.replicas: list[DistributedDataParallel] = []  # their buckets are probed
        # (owner module, attribute, local shard) of every tensor-parallel parameter that DDP
        # turned into a plain local tensor: snapshots show them as DTensors (runner.snapshots).
        self.localized: list[tuple[nn.Module, str, nn.Parameter]] = []
        self.own_group = False  # the process group of one process, made here (setup_distributed)

    @property
    def coords(self) -> dict[str, int]:
        return self.shape.coords(self.global_rank)

    def _configure_launcher(self) -> None:
        if self.shape.world > 1:
            super()._configure_launcher()
        # One process (micro-batches on one device): nothing to launch, and Lightning's launcher
        # would set MASTER_ADDR, WORLD_SIZE, ... in this process, for every later run in it.

    def setup_distributed(self) -> None:
        if self.shape.world == 1 and not dist.is_initialized():
            # A process group of one, its store in this process: no port, no address. Gloo
            # still binds a device: to loopback.
            bind_gloo_to_loopback()
            dist.init_process_group(
                self._get_process_group_backend(),
                store=dist.HashStore(),
                rank=0,
                world_size=1,
                timeout=self._timeout,
            )
            self.own_group = True
        super().setup_distributed()  # Lightning's ranks; its process group exists by now
        self.device_mesh = init_device_mesh(
            self.root_device.type, self.shape.shape, mesh_dim_names=DIMS
        )

    def split_layers(self, module: nn.Module) -> nn.Module:
        return self.parallelize(module, self.device_mesh["tp"]) if self.shape.tp > 1 else module

    def replicate(self, module: nn.Module) -> nn.Module:
        """DDP over the data-parallel dimension; the module itself with one replica."""
        if self.shape.dp == 1:
            return module
        if self.shard in ("gradients", "full"):
            dp = self.device_mesh["dp"]
            self.fsdp += shard_module(module, self.unit_list, dp, self.shard, self.microbatches)
            return module
        gpu = self.root_device.type == "cuda"
        split = any(isinstance(p, DTensor) for p in module.parameters())
        replica = DistributedDataParallel(
            module,
            device_ids=[self.root_device.index] if gpu else None,
            device_mesh=self.device_mesh["dp"],
            bucket_cap_mb=self.bucket_cap_mb,
            broadcast_buffers=False,  # the decoder's fixed positions are equal on every rank
        )
        self.replicas.append(replica)
        # DDP keeps each DTensor shard as a plain local tensor (runner/compat/ddp_dtensor.py);
        # after the first forward the module lists none of them. The optimizer holds these
        # tensors: a snapshot needs them.
        for name, param in localized_shards(module, split):
            owner, _, attr = name.rpartition(".")
            self.localized.append((module.get_submodule(owner), attr, param))
        return replica

    def held(self, weight: Any) -> Any:
        """The parameter the optimizer steps for a module's weight: under DDP over tensor-parallel
        shards, the local tensor DDP keeps in the DTensor's place (its gradient is there)."""
        for owner, attr, local in self.localized:
            if getattr(owner, attr, None) is weight:
                return local
        return weight

    def install_probes(self, record: Callable[[Transfer], None]) -> None:
        """Every replica's gradient buckets (DDP over the dp dimension), and every collective
        DTensor runs for the split layers."""
        for replica in self.replicas:
            hook_buckets(replica, record)
        sharded_probe.install(self.fsdp, record, gpu=self.root_device.type == "cuda")
        for optimizer in self.optimizers:
            if isinstance(optimizer, ZeroOptimizer):
                optimizer.record = record
        if self.shape.tp > 1:
            collectives.install(record)

    def configure_ddp(self) -> None:
        module = self.lightning_module
        self.unit_list = self.units(module.model)
        module.model = self.replicate(self.split_layers(module.model))

    def on_validation_end(self) -> None:
        """Validation's forward gathered FSDP's weights, and no backward freed them: free them, so
        that every training step gathers what the one before it did."""
        super().on_validation_end()
        for module in self.fsdp:
            module.reshard()

    def setup_optimizers(self, trainer: Any) -> None:
        super().setup_optimizers(trainer)
        if self.shard == "optimizer":  # ZeRO-1: each replica steps its share of the state
            group = self.device_mesh["dp"].get_group()
            self.optimizers = [zero_optimizer(o, group) for o in self.optimizers]

    def teardown(self) -> None:
        failing = sys.exc_info()[1]  # after a failed step, Lightning tears down in its handler
        try:
            super().teardown()
        except RuntimeError:
            # Moving DTensor weights that the failed step still holds raises ("Couldn't swap");
            # the step's own error is the one the user must see.
            if failing is None:
                raise
        finally:
            if self.own_group:  # a later run in this process starts without one
                dist.destroy_process_group()
                self.own_group = False


def strategy(cfg: DictConfig, mesh: Mesh) -> MeshStrategy:
    # A model of the user's (no spec) may be sharded, as one unit; it has no tensor-parallel plan
    # (refused before launch: runner/layouts/rules.py).
    spec = spec_for(cfg.model) or ModelSpec(name="", config=object)
    return MeshStrategy(
        mesh,
        partial(spec.parallelize, vocab_parallel=cfg.parallel.vocab_parallel),
        cfg.parallel.bucket_cap_mb,
        cfg.parallel.shard,
        spec.recompute_units,
        process_group_backend=backend(cfg),
        timeout=timeout(cfg),
    )
