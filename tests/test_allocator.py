"""Freed memory kept for the next step (runner/launcher/allocator.py)."""

import json
import os
import platform
import subprocess
import sys

import pytest
import torch

from runner.launcher import kernel_cache
from runner.training import rank as training
from tests.helpers.jobs import compose_job

# In a fresh process (glibc adapts its thresholds to what it has seen freed): where a 2 MiB block
# comes from (mmap'd bytes before and after), and whether the heap shrinks when 64 MiB of 1 MiB
# blocks (a step's activations) are freed. Read with mallinfo2 (glibc 2.33+).
BLOCKS = """
import ctypes, json, sys, torch
from runner.launcher.allocator import keep_freed_memory
FIELDS = "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"
class Info(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in FIELDS.split()]
libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Info
if sys.argv[1] == "kept":
    assert keep_freed_memory()
mapped = libc.mallinfo2().hblkhd
block = torch.ones(1 << 19)
mapped = libc.mallinfo2().hblkhd - mapped
del block
blocks = [torch.ones(256, 1024) for _ in range(64)]
heap = libc.mallinfo2().arena
del blocks
print(json.dumps({"mapped": mapped, "heap": heap, "heap_after_free": libc.mallinfo2().arena}))
"""


def blocks(*modes: str) -> list[dict[str, int]]:
    """Each mode's figures, from processes run side by side (each imports torch: seconds)."""
    started = [
        subprocess.Popen([sys.executable, "-c", BLOCKS, mode], stdout=subprocess.PIPE, text=True)
        for mode in modes
    ]
    outputs = [process.communicate(timeout=120)[0] for process in started]
    assert [process.returncode for process in started] == [0] * len(modes)
    return [json.loads(out) for out in outputs]


@pytest.mark.slow
@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc")
def test_freed_blocks_stay_in_the_heap_for_the_next_step() -> None:
    default, kept = blocks("default", "kept")
    assert default["mapped"] >= 2 << 20  # glibc: mmap'd, and unmapped when freed
    assert kept["mapped"] == 0  # from the heap
    # The heap keeps what the step freed (by default glibc may hand the top of it back).
    assert kept["heap_after_free"] == kept["heap"] >= 64 << 20


def test_every_rank_keeps_freed_memory_unless_turned_off(monkeypatch) -> None:
    calls: list[bool] = []
    monkeypatch.setattr(training, "keep_freed_memory", lambda: calls.append(True) or True)
    training.set_process(compose_job("hardware.devices=1")[0])
    assert calls == [True]
    training.set_process(compose_job("hardware.devices=1", "hardware.keep_freed_memory=false")[0])
    assert calls == [True]


# What bf16 products of new shapes leave behind in oneDNN's and ideep's caches: 8 new shapes, then
# 8 more. Capped at 4 by the environment, the first 8 fill them (4 kept) and the next evict as many
# as they add. Whether a host's bf16 products go through oneDNN at all is the CPU's: torch sends
# them there where the CPU has AVX-512 (BF16) or AMX; an AVX2-only CPU multiplies them in torch's
# own kernels, which compile and keep nothing.
SHAPES = """
import json, os, torch
import runner  # caps the caches, unless the environment set them
from runner.training.callbacks.memory import allocated_bytes
w = torch.randn(256, 1024, dtype=torch.bfloat16)
def grow(first):
    before = allocated_bytes()
    for rows in range(first, first + 8):
        torch.randn(rows, 256, dtype=torch.bfloat16) @ w
    return allocated_bytes() - before
print(json.dumps([os.environ["LRU_CACHE_CAPACITY"], grow(100), grow(200)]))
"""
LIBRARY_DEFAULT = "1024"  # both caches' own capacity, the cap the runner lowers


def shapes_left_behind(*caps: str | None) -> list[tuple[str, int, int]]:
    """Each cap's (cap, bytes the first 8 shapes left, bytes the next 8 added), from processes run
    side by side; None: the environment sets no cap."""
    started = []
    for cap in caps:
        env = {k: v for k, v in os.environ.items() if k not in kernel_cache.VARIABLES}
        env |= dict.fromkeys(kernel_cache.VARIABLES, cap) if cap else {}
        started.append(subprocess.Popen([sys.executable, "-c", SHAPES], stdout=subprocess.PIPE,
                                        text=True, env=env))  # fmt: skip
    outputs = [process.communicate(timeout=120)[0] for process in started]
    assert [process.returncode for process in started] == [0] * len(caps)
    return [tuple(json.loads(out)) for out in outputs]


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="counts glibc's malloc")
def test_the_runner_caps_the_kernel_caches_unless_the_environment_sets_them() -> None:
    """runner/launcher/kernel_cache.py: importing the runner caps them at 32, where 16 new shapes
    all stay; a cap the user set stays, and holds: past it, a new shape evicts an old one. The
    probe: what 8 new shapes leave behind uncapped, at the libraries' own 1,024. Where that is
    under a MiB (half a MiB a shape where they are cached), this CPU's bf16 products compile
    nothing to keep, and there is nothing to cap."""
    (_, probe, _), (cap, filled, kept), (small, small_filled, evicted) = shapes_left_behind(
        LIBRARY_DEFAULT, None, "4"
    )
    assert cap == str(kernel_cache.CAPACITY) and small == "4"
    if probe < 1 << 20:
        pytest.skip(
            f"this CPU's bf16 products keep no compiled kernels: 8 new shapes left {probe} bytes "
            f"uncapped (torch's oneDNN bf16 path: "
            f"{torch.ops.mkldnn._is_mkldnn_bf16_supported()}, CPU capability "
            f"{torch.backends.cpu.get_cpu_capability()})"
        )
    assert kept > filled / 2
    assert small_filled > 1 << 20 and evicted < small_filled / 8


# What fp32 products of new sizes leave in use once done: MKL's memory manager keeps each packing
# buffer for the next product of its size, unless MKL_DISABLE_FAST_MM was set when torch loaded
# MKL; importing the runner first sets it (runner/launcher/kernel_cache.py), importing torch first
# is too late for it. Four sizes, each once.
PRODUCTS = """
import json, sys
if sys.argv[1] == "torch first":
    import torch
import runner
import torch
from runner.training.callbacks.memory import allocated_bytes
torch.set_num_threads(2)
before = allocated_bytes()
for n in (512, 768, 1024, 1536):
    a = torch.randn(n, 256) @ torch.randn(256, n)
    del a
print(json.dumps(allocated_bytes() - before))
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="counts glibc's malloc")
def test_the_runner_turns_mkls_buffer_pool_off_before_torch_loads_it() -> None:
    """The probe: the same products with torch loaded before the runner's import, MKL's pool on
    (where it keeps under a MiB, this torch's fp32 products keep no buffers: no MKL, or MKL's own
    switch set by the user); with the runner first, under 64 KiB kept."""
    env = {k: v for k, v in os.environ.items() if k != kernel_cache.NO_BUFFER_POOL}
    orders = ("torch first", "runner first")
    runs = [subprocess.Popen([sys.executable, "-c", PRODUCTS, first], stdout=subprocess.PIPE,
                             text=True, env=env) for first in orders]  # fmt: skip
    pooled, kept = (json.loads(run.communicate(timeout=120)[0]) for run in runs)
    assert [run.returncode for run in runs] == [0, 0]
    if pooled < 1 << 20:
        pytest.skip(f"this torch's fp32 products keep {pooled} bytes with MKL's pool on")
    assert kept < 1 << 16, (pooled, kept)
