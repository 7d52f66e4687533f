"""Freed memory kept for the next step (runner/launcher/allocator.py)."""

import json
import os
import platform
import subprocess
import sys

import pytest

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


# What bf16 products of new shapes leave behind in oneDNN's and ideep's caches, capped at 4 by the
# environment: 8 new shapes fill them (4 kept), 8 more evict as many as they add.
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


def shapes_left_behind(cap: str | None) -> tuple[str, int, int]:
    env = {k: v for k, v in os.environ.items() if k not in kernel_cache.VARIABLES}
    env |= dict.fromkeys(kernel_cache.VARIABLES, cap) if cap else {}
    done = subprocess.run([sys.executable, "-c", SHAPES], capture_output=True, text=True,
                          env=env, check=True)  # fmt: skip
    return tuple(json.loads(done.stdout))


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="counts glibc's malloc")
def test_the_runner_caps_the_kernel_caches_unless_the_environment_sets_them() -> None:
    """runner/launcher/kernel_cache.py: importing the runner caps them at 32, where 16 new shapes
    all stay; a cap the user set stays, and holds: past it, a new shape evicts an old one."""
    cap, filled, kept = shapes_left_behind(None)
    assert cap == "32" and kept > filled / 2
    cap, filled, evicted = shapes_left_behind("4")
    assert cap == "4" and filled > 1 << 20 and evicted < filled / 8
