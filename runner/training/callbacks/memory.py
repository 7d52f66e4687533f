"""The most memory a rank used for training: what the planner's `pred/peak_memory_gib` is checked
against (docs/measurement.md).

On a GPU: CUDA's peak allocated bytes from training's start, every tensor the rank holds included.
On a CPU there is no allocator to ask: the process's peak resident memory over training (Linux's
VmHWM, reset at training's start through /proc/self/clear_refs) less what was resident then, plus
the parameters the rank held then. So both count the weights, and what training adds to them:
gradients, optimizer state, activations, workspace. Elsewhere (no /proc) nothing is measured.

Resident memory is the allocator's footprint, not what tensors hold: glibc keeps what was freed
(runner/launcher/allocator.py) and cannot always reuse it, so a step that allocates and frees
buffers of many sizes (FSDP's gathered weights and gradients) grows it beyond what it ever held at
once (measured: a 13.7 M-parameter decoder sharded over 2 ranks held 100 MiB less than under DDP and
grew resident memory 90 MiB more). `peak_allocated_gib` is the CPU's counterpart of CUDA's peak:
malloc's bytes in use (glibc's mallinfo2), sampled where a step's holdings change (the end of
forward and of backward, each Linear layer's backward as it begins, every data-parallel
collective the rank waits for, the optimizer's step), less what was in use at training's start,
plus the parameters held then. Only on the rank's own thread: a collective that ends in gloo's
thread ends at a point of the step that depends on the machine's speed. On a GPU it is CUDA's peak.
"""

from __future__ import annotations

import ctypes
import platform
import re
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn

GIB = 2**30
STATUS, CLEAR_REFS = Path("/proc/self/status"), Path("/proc/self/clear_refs")


def resident_kib(field: str) -> int:
    """VmRSS (resident now) or VmHWM (its peak since the last reset) of this process, in KiB."""
    return int(re.search(rf"{field}:\s+(\d+) kB", STATUS.read_text()).group(1))


class MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
            "fordblks", "keepcost",
        )
    ]  # fmt: skip


def _mallinfo2() -> ctypes._CFuncPtr | None:
    if platform.libc_ver()[0] != "glibc":
        return None
    try:
        call = ctypes.CDLL("libc.so.6").mallinfo2  # glibc 2.33 and later
    except (OSError, AttributeError):
        return None
    call.restype = MallInfo2
    return call


MALLINFO2 = _mallinfo2()


def allocated_bytes() -> int | None:
    """What glibc's malloc has handed out and not had back (its heap and its mmap'd blocks):
    torch's CPU tensors are allocated there. None without glibc's mallinfo2."""
    if MALLINFO2 is None:
        return None
    info = MALLINFO2()
    return info.uordblks + info.hblkhd


def local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t  # a DTensor's shard, not the whole


def local_bytes(module: nn.Module) -> int:
    """The bytes of the parameters this rank holds (a DTensor's local shard, not the whole)."""
    return sum(t.numel() * t.element_size() for t in map(local, module.parameters()))


def storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """The bytes under `tensors`, each storage once (views share theirs)."""
    held = {}
    for t in map(local, tensors):
        held[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(held.values())


class PeakMemory:
    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.base_kib: int | None = None  # resident at training's start (CPU)
        self.held_bytes = 0  # the parameters held at training's start (CPU)
        self.base_allocated: int | None = None  # malloc's bytes in use then (CPU)
        self.top_allocated = 0  # the most in use at a sample
        self.step_base: int | None = None  # in use at this step's start
        self.held: int | None = None  # what the last forward left for its backward
        self.workspace: int | None = None  # in use between steps beyond the rank's tensors

    def start(self, module: nn.Module) -> None:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
            return
        self.held_bytes = local_bytes(module)
        self.base_allocated = allocated_bytes()
        self.top_allocated = self.base_allocated or 0
        try:
            CLEAR_REFS.write_text("5")  # "5": reset the peak resident size (Linux 4.0 on)
        except OSError:
            return  # not Linux, or not allowed: nothing to measure against
        self.base_kib = resident_kib("VmRSS")
        for layer in module.modules():
            if isinstance(layer, nn.Linear):
                layer.register_forward_hook(self._sample_at_backward)

    def _sample_at_backward(self, _: nn.Module, __: Any, output: Any) -> None:
        # Backward grows the gradients while it frees the activations: the peak may fall inside it
        if isinstance(output, torch.Tensor) and output.requires_grad:
            output.register_hook(lambda _: self.sample())

    def sample(self) -> None:
        """Where a step's holdings may peak: malloc's bytes in use now (CPU)."""
        if (
            self.base_allocated is not None
            and threading.current_thread() is threading.main_thread()
        ):
            self.top_allocated = max(self.top_allocated, allocated_bytes() or 0)

    def in_use(self) -> int | None:
        """Bytes the rank's tensors hold now: CUDA's, or malloc's on a CPU."""
        return torch.cuda.memory_allocated() if self.cuda else allocated_bytes()

    def step_started(self) -> None:
        self.step_base = self.in_use()

    def forward_ended(self) -> None:
        """Forward's activations are all held, nothing of backward made yet, and whatever the
        step's start held (the last step's gradients) still held."""
        now = self.in_use()
        if now is not None and self.step_base is not None:
            self.held = now - self.step_base

    def beyond_tensors(self, module: nn.Module, optimizers: list[Any]) -> None:
        """At a step's start: what is in use beyond the rank's weights, gradients and optimizer
        state (CUDA's or malloc's, as the peak counts it): the math library's buffers."""
        now = self.in_use()
        if now is None or (not self.cuda and self.base_allocated is None):
            return
        grown = now if self.cuda else now - self.base_allocated + self.held_bytes
        params = list(module.parameters())
        state = [t for o in optimizers for s in o.state.values() for t in s.values()]
        grads = [p.grad for p in params if p.grad is not None]
        tensors = [t for t in [*params, *grads, *state] if isinstance(t, torch.Tensor)]
        self.workspace = max(0, grown - storage_bytes(tensors))

    def workspace_gib(self) -> float | None:
        return None if self.workspace is None else self.workspace / GIB

    def held_gib(self) -> float | None:
        return None if self.held is None else self.held / GIB

    def peak_allocated_gib(self) -> float | None:
        if self.cuda:
            return torch.cuda.max_memory_allocated() / GIB
        if self.base_allocated is None:
            return None
        return (self.held_bytes + self.top_allocated - self.base_allocated) / GIB

    def peak_gib(self) -> float | None:
        if self.cuda:
            return torch.cuda.max_memory_allocated() / GIB
        if self.base_kib is None:
            return None
        # Training's peak is at least what was resident at its start: Linux updates VmHWM
        # lazily, and a tiny model's run has read it a few KiB below that start (-4e-5 GiB)
        grown = max(0, resident_kib("VmHWM") - self.base_kib) * 1024
        return (self.held_bytes + grown) / GIB
