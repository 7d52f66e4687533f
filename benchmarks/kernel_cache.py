"""What capping the CPU math libraries' caches of compiled products costs and saves
(runner/launcher/kernel_cache.py): a mixture of experts (d_model 256, 4 blocks, 4 experts, top 2,
dropless) and its dense decoder, bf16 weights, batch 8 x 64 tokens, one process, forward and
backward, each in a fresh process with the caches at oneDNN's default (1,024 shapes) and at the
runner's cap. Prints each side's growth of malloc's bytes in use a step (after 3 warm steps) and
its seconds a step, and the ratios capped / uncapped. The target: the capped mixture of experts'
memory flat (under 1 MiB a step), the dense decoder's time within 5 % of uncapped. Then MKL's
memory manager: the dense decoder in fp32 (MKL's products) at a batch of 64, with the pool (MKL's
default) and without (the runner's), what malloc holds between steps beyond the first step's start
(the gradients, and the pool's buffers) and its seconds a step. The target: without the pool, under
1 MiB beyond the gradients, and a step within 5 % of the pool's.
Usage: .venv/bin/python -m benchmarks.kernel_cache
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from benchmarks.common import ratio_line
from runner.launcher.kernel_cache import CAPACITY, NO_BUFFER_POOL, VARIABLES

WARM, STEPS = 3, 12


def one_run(kind: str, dtype: str = "bfloat16", batch: int = 8) -> None:
    """In a fresh process (the caps are read once): train, and print the figures as JSON."""
    import torch
    from hydra.utils import instantiate

    from benchmarks.plain_loop import config
    from runner.training.callbacks.memory import allocated_bytes

    torch.manual_seed(0)
    shape = ["model.d_model=256", "model.n_layers=4", "data.vocab_size=2048"]
    model = instantiate(config([f"model={kind}", *shape]).model).to(getattr(torch, dtype))
    grads = sum(p.numel() * p.element_size() for p in model.parameters())

    def step() -> None:
        tokens = torch.randint(0, 2048, (batch, 64))
        model(tokens).float().logsumexp(-1).mean().backward()

    first = allocated_bytes()
    for _ in range(WARM):
        step()
    start, began = allocated_bytes(), time.perf_counter()
    for _ in range(STEPS):
        step()
    seconds = (time.perf_counter() - began) / STEPS
    grown = (allocated_bytes() - start) / 2**20 / STEPS
    held = (allocated_bytes() - first - grads) / 2**20  # beyond the gradients
    print(json.dumps({"MiB/step": grown, "s/step": seconds, "MiB held": held}))


def side(kind: str, capped: bool, pool: bool = False, *run: str | int) -> dict[str, float]:
    """One fresh process's figures. With MKL's pool: torch loads before the runner's import
    would turn it off (MKL reads its switch when torch loads it)."""
    env = {**os.environ, **{name: str(CAPACITY if capped else 1024) for name in VARIABLES}}
    env.pop(NO_BUFFER_POOL, None)
    env |= {} if pool else {NO_BUFFER_POOL: "1"}
    first = "import torch; " if pool else ""
    code = f"{first}from benchmarks.kernel_cache import one_run; one_run(*{[kind, *run]!r})"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, env=env)  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    print("| model | caches | malloc growth MiB a step | s a step |\n|---|---|---:|---:|")
    figures = {}
    for kind in ("moe", "decoder"):
        for capped in (False, True):
            got = figures[kind, capped] = side(kind, capped)
            cache = f"{CAPACITY} shapes" if capped else "1,024 (default)"
            print(f"| {kind} | {cache} | {got['MiB/step']:.1f} | {got['s/step']:.3f} |")
    for kind in ("moe", "decoder"):
        slower = figures[kind, True]["s/step"] / figures[kind, False]["s/step"]
        print(f"{kind}: time capped / uncapped {slower:.2f}")
    print(ratio_line("moe bf16 malloc growth a step, capped (MiB)",
                     figures["moe", True]["MiB/step"], "< 1"))  # fmt: skip
    dense = figures["decoder", True]["s/step"] / figures["decoder", False]["s/step"]
    print(ratio_line("dense bf16 step time, capped / uncapped", dense, "<= 1.05"))
    print("\n| decoder fp32, batch 64 | MiB held beyond the gradients | s a step |")
    print("|---|---:|---:|")
    pools = {}
    for pool in (True, False):
        got = pools[pool] = side("decoder", True, pool, "float32", 64)
        state = "on" if pool else "off"
        print(f"| MKL's pool {state} | {got['MiB held']:.1f} | {got['s/step']:.3f} |")
    print(ratio_line("fp32 MiB held beyond the gradients, MKL's pool off",
                     pools[False]["MiB held"], "< 1"))  # fmt: skip
    slower = pools[False]["s/step"] / pools[True]["s/step"]
    print(ratio_line("fp32 step time, MKL's pool off / on", slower, "<= 1.05"))


if __name__ == "__main__":
    main()
