"""Context parallelism's part of a mesh: each replica's samples split along the sequence over the
mesh's cp ranks, every rank holding its positions (load-balanced: runner/layouts/context/ring.py)
of every token, target and activation for the whole model; the model's attention run as a ring
over the cp ranks. The weights stay whole: the cp ranks sum their gradients with the data-parallel
replicas' (runner/layouts/data/replicate.py)."""

from __future__ import annotations

from typing import Any

import torch
from omegaconf import DictConfig
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from runner.errors import require
from runner.job import Resolved
from runner.layouts.context import probe
from runner.layouts.context.ring import Ring, RingAttention
from runner.layouts.probes import Recorder


class ContextSplit:
    def __init__(self, spec: Any, cp: int, seq_len: int) -> None:
        self.spec, self.cp, self.seq_len = spec, cp, seq_len
        self.positions: torch.Tensor | None = None  # this rank's, once the mesh is made

    def apply(self, module: nn.Module, mesh: DeviceMesh) -> nn.Module:
        """`module` (a whole model, or a pipeline stage) run on this rank's positions; itself
        with one cp rank."""
        if self.cp == 1:
            return module
        attention = RingAttention(Ring(mesh["cp"].get_group()), self.seq_len)
        self.positions = attention.mine
        return self.spec.split_context(module, attention, attention.mine.tolist())

    def batch(self, batch: Any) -> Any:
        """This rank's positions of a batch of (tokens, targets), (samples, seq_len) each."""
        if self.positions is None:
            return batch
        x, y = batch
        require(
            x.shape[1] == self.seq_len,
            "data.seq_len",
            f"context parallelism splits sequences of {self.seq_len} positions, and a batch came "
            f"with {x.shape[1]}",
        )
        index = self.positions.to(x.device)
        return x[:, index], y[:, index]

    def install_probes(self, record: Recorder) -> None:
        if self.cp > 1:
            probe.install(record)


def context_of(cfg: DictConfig, r: Resolved) -> ContextSplit:
    """The job's context split (parallel.cp; with cp 1, none)."""
    return ContextSplit(r.spec, r.mesh.cp, cfg.data.get("seq_len") or 0)
