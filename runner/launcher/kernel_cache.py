"""How many compiled products a CPU process keeps: oneDNN's primitive cache and ideep's (torch's
CPU products in 16 bits, and convolutions, run through them) each keep every product shape they
compiled, 1,024 of them by default, about half a MiB a shape in bf16 on this host (measured:
200 shapes of a d_model 256 expert's product grew malloc's bytes in use by 110 MiB). A dense
model's step multiplies a dozen shapes, the same every step; a mixture of experts' dropless
products (runner/models/moe/model.py) take as many rows as the router sent each expert, a new
shape nearly every step, so its memory grew by about 30 MiB a step and would until 1,024
shapes. Capped at 32, a dense step still keeps every shape it uses, and a mixture of experts
recompiles a shape it has evicted: benchmarks/kernel_cache.py measured d_model 256, bf16, 4
experts: 30.8 MiB a step uncapped, none capped, its step 0.159 s uncapped and 0.137 capped; the
dense decoder 0.055 and 0.053 s. A cap the user set in the environment stays. Light to import:
it must run before torch computes anything."""

from __future__ import annotations

import os

CAPACITY = 32
VARIABLES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")  # oneDNN's, ideep's


def cap_kernel_caches() -> None:
    """Cap both caches for this process and the processes it starts, before either is made."""
    for name in VARIABLES:
        os.environ.setdefault(name, str(CAPACITY))
