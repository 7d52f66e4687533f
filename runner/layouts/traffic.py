"""Bytes per step from formulas: what each mesh dimension hands to collectives and P2P. Each
layout gives its own (runner/layouts/<layout>/traffic.py); the planner adds them up.

The seed's, nccl-tests' and Megatron-LM's arithmetic: payload S per collective call; a ring
all-reduce moves 2(n-1)/n * S per rank. Per-rank figures are means over ranks (pipeline stages
differ), as the runs measure them. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Traffic:
    """Per rank and step (means over ranks): payload bytes and calls, by mesh dimension."""

    payload: dict[str, float] = field(default_factory=dict)
    calls: dict[str, float] = field(default_factory=dict)
    # The last call's payload, where the layout starts it only when compute is done (DDP's last
    # bucket, all-reduced after backward): what no computation can hide.
    tail: dict[str, float] = field(default_factory=dict)
    # Payload by collective, "dp/all_gather" and the like, where a dimension runs several kinds
    # (sharded data parallelism: runner/layouts/sharded/traffic.py); empty where it runs one.
    by_collective: dict[str, float] = field(default_factory=dict)


def ring_allreduce_bytes(payload: float, n: int) -> float:
    """Bytes each rank sends (and receives) in a ring all-reduce of `payload` bytes over n ranks."""
    return 2 * (n - 1) / n * payload
