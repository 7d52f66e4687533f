"""Freed memory kept for the next step (runner/launcher/allocator.py)."""

import json
import platform
import subprocess
import sys

import pytest

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
