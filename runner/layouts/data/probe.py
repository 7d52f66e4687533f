"""Data parallelism's probe: a DDP communication hook around every gradient bucket's all-reduce,
stamping when the bucket was ready (its launch) and when its all-reduce finished, with its
payload. The all-reduce overlaps backward: only what outlasts the last launch blocks the rank.
On a GPU the stamps are events: the first on the stream backward runs on, when the bucket's
gradients are made; the second in the future's callback, on the stream that waits for the
all-reduce (runner/clock.py)."""

# No `from __future__ import annotations`: DDP reads the hook's annotations and wants the class
# dist.GradBucket itself, not its name.
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

from runner import clock
from runner.layouts.probes import Transfer


def hook_buckets(ddp: DistributedDataParallel, record: Callable[[Transfer], None]) -> None:
    """Record every bucket's all-reduce of `ddp`, over its own process group."""

    def counting(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        ready = clock.stamp()
        size = bucket.buffer().numel() * bucket.buffer().element_size()

        def done(fut: torch.futures.Future) -> torch.Tensor:
            record(Transfer("dp", "all-reduce", ready, clock.stamp(), size, blocking=False))
            return fut.value()

        return allreduce_hook(state, bucket).then(done)

    ddp.register_comm_hook(ddp.process_group, counting)
