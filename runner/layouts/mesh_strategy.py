"""A Lightning strategy for a (pp, dp, cp, tp) device mesh, composed of one part per technique:
the tensor split (runner/layouts/tensor/split.py), the context split (runner/layouts/context/
split.py), replication over dp (runner/layouts/data/replicate.py) and sharding over dp
(runner/layouts/sharded/shard.py), each over the replicas' cp ranks too. Alone it runs tensor and
context parallelism, with data parallelism or sharded replicas or not; the pipeline strategy adds
the stages.

It reuses DDPStrategy's process group, ranks and reductions. Where DDP would wrap the whole
LightningModule, it splits the plain model over the mesh's tp dimension and replicates (or
shards) it over the dp dimension (with cp's) only: DDP averages gradients between replicas,
never between the shards of one layer.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch.distributed as dist
from omegaconf import DictConfig
from pytorch_lightning.strategies import DDPStrategy
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy

from runner.compat.device_mesh import flattened
from runner.job import Resolved, reshards_after_forward, resolved_shard
from runner.launcher.cluster import bind_gloo_to_loopback
from runner.layouts.context.split import ContextSplit, context_of
from runner.layouts.data.replicate import Replication
from runner.layouts.expert.split import ExpertSplit
from runner.layouts.layout import Layout, LocalShard
from runner.layouts.probes import Recorder
from runner.layouts.process_group import backend, timeout
from runner.layouts.sharded.shard import Sharding, sixteen_bit
from runner.layouts.tensor.split import TensorSplit, plan_of
from runner.mesh import DIMS, Mesh
from runner.models.spec import ModelSpec


class MeshStrategy(DDPStrategy, Layout):
    strategy_name = "mesh"
    microbatches = 1  # a pipeline's, or gradient accumulation's (the pipeline strategy's)

    def __init__(
        self,
        shape: Mesh,
        parallelize: Callable[[nn.Module, DeviceMesh], nn.Module],
        bucket_cap_mb: float | None = None,
        shard: str = "none",
        units: Callable[[nn.Module], list[nn.Module]] = lambda model: [],
        sequence: bool = False,  # parallel.sequence_parallel: what `parallelize` splits too
        context: ContextSplit | None = None,  # parallel.cp: the sequence split over the cp ranks
        expert_spec: Any = None,  # parallel.ep: the model's spec, which finds its experts
        policy: MixedPrecisionPolicy | None = None,  # 16-bit weights over fp32 masters: FSDP2's
        reshard_after_forward: str = "default",  # ZeRO-3's (runner/job.py)
        param_gather: str = "forward",  # the distributed optimizer's (runner/job.py)
        **kw: Any,
    ) -> None:
        # The runner launches the processes itself (runner.launcher.launch), or torchrun/SLURM does.
        super().__init__(start_method="popen", **kw)
        self.shape = shape
        self.split = TensorSplit(parallelize, shape.tp, sequence)
        self.context = context or ContextSplit(None, 1, 0)
        self.experts = ExpertSplit(expert_spec, shape)
        self.replication = Replication(bucket_cap_mb)
        # parallel.shard: nothing to split without several replicas (or their cp ranks); over
        # 16-bit weights FSDP2 holds the masters, on one replica too
        level = resolved_shard(shard, shape.size("dp"))
        sharded = level != "none" or policy is not None
        reshard = reshards_after_forward(level, reshard_after_forward, shape.pp)
        after_step = param_gather == "step"
        self.sharding = Sharding(level, units, policy, reshard, after_step) if sharded else None
        self.device_mesh: DeviceMesh | None = None
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

    # --- the parts, composed ---
    def split_layers(self, module: nn.Module) -> nn.Module:
        split = self.context.apply(self.split.apply(module, self.device_mesh), self.device_mesh)
        return self.experts.apply(split, self.global_rank)

    def replicas(self) -> DeviceMesh:
        """The ranks that sum gradients: the data-parallel ones, with their cp ranks (1-D)."""
        return flattened(self.device_mesh, ("dp", "cp") if self.shape.cp > 1 else ("dp",))

    def replicate(self, module: nn.Module) -> nn.Module:
        """Over the data-parallel dimension (with the replicas' cp ranks, which sum gradients
        too): sharded, or replicated by DDP; the module itself with one replica (but over
        16-bit weights: FSDP2 over that one)."""
        if self.sharding is not None:
            experts = self.experts.sharded(module, self.root_device.type)
            return self.sharding.apply(module, self.replicas(), experts)
        if self.shape.size("dp") == 1:
            return module
        others = self.experts.names(module)
        return self.replication.apply(module, self.replicas(), self.root_device, others)

    def optimizer_step(self, *args: Any, **kwargs: Any) -> Any:
        out = super().optimizer_step(*args, **kwargs)
        if self.sharding is not None:
            self.sharding.gather_after_step()
        return out

    def post_backward(self, closure_loss: Any) -> None:
        super().post_backward(closure_loss)
        self.experts.sync()  # DDP's all-reduce is done: backward has waited for it

    def batch_to_device(self, batch: Any, *args: Any, **kwargs: Any) -> Any:
        """The batch on this rank's device; with context parallelism, its positions only."""
        return self.context.batch(super().batch_to_device(batch, *args, **kwargs))

    def held(self, weight: nn.Parameter) -> nn.Parameter:
        """The parameter the optimizer steps for a module's weight."""
        return self.replication.held(weight)

    def configure_ddp(self) -> None:
        module = self.lightning_module
        if self.sharding is not None:
            self.sharding.find_units(module.model)
        module.model = self.replicate(self.split_layers(module.model))

    def on_validation_end(self) -> None:
        super().on_validation_end()
        if self.sharding is not None:
            self.sharding.reshard()

    # --- the layout's answers (runner/layouts/layout.py) ---
    def install_probes(self, record: Recorder) -> None:
        self.replication.install_probes(record)
        if self.sharding is not None:
            gpu = self.root_device.type == "cuda"
            self.sharding.install_probes(record, gpu)
        self.split.install_probes(record)
        self.context.install_probes(record)
        self.experts.install_probes(record)

    def local_shards(self) -> list[LocalShard]:
        return self.replication.localized + self.experts.shards(self.root_device.type)

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


def strategy(cfg: DictConfig, r: Resolved) -> MeshStrategy:
    # A model of the user's (no spec) may be sharded, as one unit; it has no tensor-parallel plan
    # (refused before launch: runner/layouts/rules.py).
    spec = r.spec or ModelSpec(name="", config=object)
    return MeshStrategy(
        r.mesh,
        plan_of(spec, cfg.parallel.vocab_parallel, cfg.parallel.sequence_parallel),
        cfg.parallel.bucket_cap_mb,
        cfg.parallel.shard,
        spec.recompute_units,
        sequence=cfg.parallel.sequence_parallel,
        context=context_of(cfg, r),
        expert_spec=spec,
        policy=sixteen_bit(cfg.trainer.precision, cfg.trainer.grad_reduce),
        reshard_after_forward=cfg.parallel.reshard_after_forward,
        param_gather=cfg.parallel.param_gather,
        process_group_backend=backend(cfg),
        timeout=timeout(cfg),
    )
