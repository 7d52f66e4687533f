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
    """A tensor-parallel parameter that torch's DDP keeps as a plain local tensor in place of its
    DTensor (runner/compat/ddp_dtensor.py): the module that owns it, its attribute, the tensor the
    optimizer steps."""

    owner: nn.Module
    attr: str
    param: nn.Parameter


class Layout:
    """One device's answers: nothing probed, no schedule, the model and its optimizer as they
    are."""

    def install_probes(self, record: Recorder) -> None:
        """Have every transfer of the layout's collectives reported to `record`."""

    def last_schedule(self) -> Schedule | None:
        """The last training step's record, where a schedule ran it as actions (a pipeline's)."""
        return None

    def state_module(self, model: nn.Module) -> nn.Module:
        """The module whose state a snapshot keeps, under names every rank holding the same
        parameters shares."""
        return model

    def optimizer_key(self) -> str:
        """The snapshot's key of this rank's optimizer state: ranks that hold the same state
        share it (as DCP expects), ranks that hold different state (pipeline stages, ZeRO-1's
        shares) do not."""
        return "optim"

    def local_shards(self) -> list[LocalShard]:
        """The tensor-parallel parameters held as local tensors, to be shown as DTensors while a
        snapshot is written or read."""
        return []


def layout_of(strategy: Any) -> Layout:
    """The running layout of a Lightning strategy: the runner's own, or one device's."""
    return strategy if isinstance(strategy, Layout) else Layout()
