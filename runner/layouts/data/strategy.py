"""Data parallelism through Lightning's DDP: whole model per rank, gradients all-reduced."""

from omegaconf import DictConfig
from pytorch_lightning.strategies import DDPStrategy

from runner.job import Resolved
from runner.layouts.data.probe import hook_buckets
from runner.layouts.layout import Layout
from runner.layouts.probes import Recorder
from runner.layouts.process_group import backend, timeout


class DataStrategy(DDPStrategy, Layout):
    """Lightning's DDP, and the probe on its gradient buckets."""

    def install_probes(self, record: Recorder) -> None:
        hook_buckets(self.model, record)


def strategy(cfg: DictConfig, r: Resolved) -> DDPStrategy:
    return DataStrategy(
        process_group_backend=backend(cfg),
        timeout=timeout(cfg),
        bucket_cap_mb=cfg.parallel.bucket_cap_mb,
        # Buffers (the decoder's fixed positions) are equal on every rank: no broadcast per step.
        broadcast_buffers=False,
        # The runner launches the processes itself (runner.launcher.launch), or torchrun/SLURM does.
        start_method="popen",
    )
