"""A training step's freed memory kept for the next step (glibc's malloc; CPU tensors).

A step frees its activations and gradients and allocates the same sizes again in the next one.
glibc by default serves a large block with mmap and unmaps it when freed, and hands the top of its
heap back to the kernel past a trim threshold; it raises both thresholds as it sees large blocks
freed, but only to 32 MiB. So every step touched the same amount of fresh memory, page by page:
on the default decoder (one process) about 7,000 minor page faults a step. Blocks up to 32 MiB
from the heap, and the heap kept up to 1 GiB: about 2,400 (the rest: blocks over 32 MiB, still
mapped afresh), 5.6 and 7.7 % more samples/s on this 2-core machine (medians of 6 rounds, two
runs of benchmarks/allocator.py) and the same peak resident memory (+1.3 %, -0.6 %): a process
keeps what it freed rather than returning it, which is what a loop repeating the same step wants.
`hardware.keep_freed_memory=false` leaves glibc's defaults; other C libraries: nothing is done.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's <malloc.h>
MMAP_THRESHOLD = 32 << 20  # the ceiling of glibc's own adaptive threshold
TRIM_THRESHOLD = 1 << 30


def keep_freed_memory() -> bool:
    """Set this process's malloc to keep freed memory; whether it could (glibc only)."""
    if platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    # Each call returns 1 on success; setting either fixes both (glibc stops adapting them).
    return bool(
        libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
        and libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
