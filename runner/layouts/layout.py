"""What the rest of the runner asks of a running layout: its probes (runner/training/callbacks/
rank_timing.py), the record of a step a schedule ran, and how its training state is laid out for
a snapshot (runner/snapshots.py). The runner's strategies inherit this class and answer for their
layout; one device (Lightning's own strategy) gets its answers as they are here. Asked through
`layout_of`, never by attribute name: a renamed method fails here, at import, not in a run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from runner.layouts.probes import Recorder, Schedule


@dataclass(frozen=True)
class LocalShard:
    """A parameter held as a plain local tensor that is a shard of a whole: a tensor-parallel one
    that torch's DDP keeps in place of its DTensor (runner/compat/ddp_dtensor.py), or a rank's
    experts (runner/layouts/expert/split.py). The module that owns it, its attribute, the tensor
    the optimizer steps, and the DTensor it is a part of: anything with the `mesh`, `placements`,
    `shape` and `stride` of DTensor's spec."""

    owner: nn.Module
    attr: str
    param: nn.Parameter
    spec: Any


class Layout:
    """One device's answers: nothing probed, no schedule, the model and its optimizer as they
    are."""

    def install_probes(self, record: Recorder) -> None:
        """Have every transfer of the layout's collectives reported to `record`."""

    def last_schedule(self) -> Schedule | None:
        """The last training step's record, where a schedule ran it as actions (a pipeline's)."""
        return None

    def state_module(self, model: nn.Module) -> nn.Module:
        """The module whose state a snapshot keeps, its parameters under the names they have in
        the whole model (as one process holds it): what lets any layout read any other's."""
        return model

    def local_shards(self) -> list[LocalShard]:
        """The parameters held as local shards, to be shown as DTensors while a snapshot is
        written or read."""
        return []


def layout_of(strategy: Any) -> Layout:
    """The running layout of a Lightning strategy: the runner's own, or one device's."""
    return strategy if isinstance(strategy, Layout) else Layout()
