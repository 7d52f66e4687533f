"""What a CPU process's math libraries keep between products, set before torch loads them.

oneDNN's primitive cache and ideep's (torch's CPU products in 16 bits, and convolutions, run
through them) each keep every product shape they compiled, 1,024 of them by default, about half a
MiB a shape in bf16 on this host (measured: 200 shapes of a d_model 256 expert's product grew
malloc's bytes in use by 110 MiB). A dense model's step multiplies a dozen shapes, the same every
step; a mixture of experts' dropless products (runner/models/moe/model.py) take as many rows as
the router sent each expert, a new shape nearly every step, so its memory grew by about 30 MiB a
step and would until 1,024 shapes. Capped at 32, a dense step still keeps every shape it uses,
and a mixture of experts recompiles a shape it has evicted: benchmarks/kernel_cache.py measured
d_model 256, bf16, 4 experts: 30.8 MiB a step uncapped, none capped, its step 0.159 s uncapped
and 0.137 capped; the dense decoder 0.055 and 0.053 s.

MKL's memory manager (torch's fp32 products on x86) keeps every packing buffer a product asked
for, to hand the next product of that size; how much is the CPU's kernels' blocking and the
shapes': on an AVX-512 Xeon 9.6 MiB between the steps of the default decoder on tp = 2 and 41 MiB
on it at a batch of 64 (one process, two threads), where an AVX2 EPYC kept a few. The planner's
workspace is a figure per precision (hardware.workspace_mib), not per host and shape: MKL is told
to allocate and free call by call (MKL_DISABLE_FAST_MM, its documented switch, read when torch
loads MKL), and keeps 0.2 MiB there; that step took 0.162 s against 0.160 with the pool
(benchmarks/kernel_cache.py measures both).

A setting the user made in the environment stays. Light to import: it must run before torch
loads."""

from __future__ import annotations

import os

CAPACITY = 32
VARIABLES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")  # oneDNN's, ideep's
NO_BUFFER_POOL = "MKL_DISABLE_FAST_MM"  # any value turns MKL's memory manager off


def cap_kernel_caches() -> None:
    """Cap both caches and turn MKL's pool off for this process and the processes it starts,
    before any is made."""
    for name in VARIABLES:
        os.environ.setdefault(name, str(CAPACITY))
    os.environ.setdefault(NO_BUFFER_POOL, "1")
