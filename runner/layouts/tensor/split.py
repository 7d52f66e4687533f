"""Tensor parallelism's part of a mesh: every layer's matrices split over the mesh's tp dimension
by the model spec's plan (DTensor's parallel styles), and with sequence parallelism the
activations between them along the sequence; its collectives probed."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from runner.layouts.probes import Recorder
from runner.layouts.tensor import probe as collectives


class TensorSplit:
    def __init__(
        self, parallelize: Callable[[nn.Module, DeviceMesh], nn.Module], tp: int, sequence: bool
    ) -> None:
        self.parallelize, self.tp, self.sequence = parallelize, tp, sequence

    def apply(self, module: nn.Module, mesh: DeviceMesh) -> nn.Module:
        """`module` (a whole model, or a pipeline stage) split over `mesh`'s tp dimension; itself
        with one tp rank."""
        return self.parallelize(module, mesh["tp"]) if self.tp > 1 else module

    def install_probes(self, record: Recorder) -> None:
        """Every collective DTensor runs for the split layers."""
        if self.tp > 1:
            collectives.install(record, self.sequence)


def plan_of(spec: Any, vocab_parallel: bool, sequence: bool) -> Callable[..., nn.Module]:
    """The spec's `parallelize` with the layout's switches. `sequence` only where it is on: a
    spec without a sequence (a user's, as docs/extending.md writes one) keeps its signature."""
    split = partial(spec.parallelize, vocab_parallel=vocab_parallel)
    return partial(split, sequence=True) if sequence else split
