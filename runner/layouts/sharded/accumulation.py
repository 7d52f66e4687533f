"""ZeRO-3 under gradient accumulation, as torchtitan runs it: every micro-batch as FSDP2 runs a
step on its own. Each unit's weights are gathered for its forward and freed after it (resharding
after forward), gathered again for its backward, its gradients reduce-scattered at once into the
sharded gradients the micro-batches sum in, and its weights freed. So a rank holds two units'
weights and sharded gradients, never the whole model's, at m times one step's gathers and
reduce-scatters.

Accumulation runs as a one-stage pipeline schedule (runner/layouts/pipeline/strategy.py), and
torch's pipelining keeps an FSDP stage's weights and whole gradients across the micro-batches: it
turns off gradient sync and resharding after backward until the last one (ZeRO-2's memory). The
stage here leaves FSDP2's settings as they are.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.pipelining import PipelineStage

# What torch's pipelining turns off between micro-batches (PipelineStage.backward_maybe_with_nosync)
DEFERRED = ("set_is_last_backward", "set_reshard_after_backward", "set_requires_gradient_sync")


@contextmanager
def as_fsdp_sets_it(module: nn.Module) -> Iterator[None]:
    """FSDP2's per-backward settings of `module` left as they are while the block runs."""
    if not isinstance(module, FSDPModule):
        yield
        return
    for name in DEFERRED:
        setattr(module, name, lambda *_, **__: None)  # the instance's, over the class's method
    try:
        yield
    finally:
        for name in DEFERRED:
            delattr(module, name)


class EachMicrobatchStage(PipelineStage):
    """A one-stage schedule's stage whose FSDP2 module gathers, reduce-scatters and frees for
    every micro-batch (the module's docstring)."""

    def backward_maybe_with_nosync(self, *args: Any, **kwargs: Any) -> Any:
        with as_fsdp_sets_it(self.submod):
            return super().backward_maybe_with_nosync(*args, **kwargs)
