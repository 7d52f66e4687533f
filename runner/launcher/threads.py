"""How many threads one rank computes with: its share of the cores, read from the CPU affinity.
Light to import (no torch), so that it can be tested and used before anything heavy loads."""

from __future__ import annotations

import os


def threads_per_rank(own: set[int], parent: set[int] | None, local_ranks: int) -> int:
    """A rank whose affinity is a strict subset of its parent's was bound by its launcher (torchrun
    with NUMA binding, srun --cpu-bind): those cores are its share already, all of them. Otherwise
    it shares its cores with the other ranks on this node: cores // ranks. An unknown parent counts
    as not binding. Never below 1."""
    bound = parent is not None and own < parent
    return max(1, len(own) if bound else len(own) // local_ranks)


def _parent_affinity() -> set[int] | None:
    # The parent may have exited (or be another user's) between getppid() and the read.
    try:
        return os.sched_getaffinity(os.getppid())
    except OSError:
        return None


def this_rank_threads(local_ranks: int) -> int:
    """threads_per_rank for this process, from its affinity and its parent's."""
    return threads_per_rank(os.sched_getaffinity(0), _parent_affinity(), local_ranks)
