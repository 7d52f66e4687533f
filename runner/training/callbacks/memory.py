"""The most memory a rank used for training: what the planner's `pred/peak_memory_gib` is checked
against (docs/measurement.md).

On a GPU: CUDA's peak allocated bytes from training's start, every tensor the rank holds included.
On a CPU there is no allocator to ask: the process's peak resident memory over training (Linux's
VmHWM, reset at training's start through /proc/self/clear_refs) less what was resident then, plus
the parameters the rank held then. So both count the weights, and what training adds to them:
gradients, optimizer state, activations, workspace. Elsewhere (no /proc) nothing is measured.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from torch import nn

GIB = 2**30
STATUS, CLEAR_REFS = Path("/proc/self/status"), Path("/proc/self/clear_refs")


def resident_kib(field: str) -> int:
    """VmRSS (resident now) or VmHWM (its peak since the last reset) of this process, in KiB."""
    return int(re.search(rf"{field}:\s+(\d+) kB", STATUS.read_text()).group(1))


def local_bytes(module: nn.Module) -> int:
    """The bytes of the parameters this rank holds (a DTensor's local shard, not the whole)."""
    tensors = (p.to_local() if hasattr(p, "to_local") else p for p in module.parameters())
    return sum(t.numel() * t.element_size() for t in tensors)


class PeakMemory:
    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.base_kib: int | None = None  # resident at training's start (CPU)
        self.held_bytes = 0  # the parameters held at training's start (CPU)

    def start(self, module: nn.Module) -> None:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
            return
        try:
            CLEAR_REFS.write_text("5")  # "5": reset the peak resident size (Linux 4.0 on)
        except OSError:
            return  # not Linux, or not allowed: nothing to measure against
        self.base_kib, self.held_bytes = resident_kib("VmRSS"), local_bytes(module)

    def peak_gib(self) -> float | None:
        if self.cuda:
            return torch.cuda.max_memory_allocated() / GIB
        if self.base_kib is None:
            return None
        grown = (resident_kib("VmHWM") - self.base_kib) * 1024
        return (self.held_bytes + grown) / GIB
