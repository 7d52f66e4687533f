"""What capping the CPU math libraries' caches of compiled products costs and saves
(runner/launcher/kernel_cache.py): a mixture of experts (d_model 256, 4 blocks, 4 experts, top 2,
dropless) and its dense decoder, bf16 weights, batch 8 x 64 tokens, one process, forward and
backward, each in a fresh process with the caches at oneDNN's default (1,024 shapes) and at the
runner's cap. Prints each side's growth of malloc's bytes in use a step (after 3 warm steps) and
its seconds a step, and the ratios capped / uncapped. The target: the capped mixture of experts'
memory flat (under 1 MiB a step), the dense decoder's time within 5 % of uncapped.
Usage: .venv/bin/python -m benchmarks.kernel_cache
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from benchmarks.common import ratio_line
from runner.launcher.kernel_cache import CAPACITY, VARIABLES

WARM, STEPS = 3, 12


def one_run(kind: str) -> None:
    """In a fresh process (the caps are read once): train, and print the figures as JSON."""
    import torch
    from hydra.utils import instantiate

    from benchmarks.plain_loop import config
    from runner.training.callbacks.memory import allocated_bytes

    torch.manual_seed(0)
    shape = ["model.d_model=256", "model.n_layers=4", "data.vocab_size=2048"]
    model = instantiate(config([f"model={kind}", *shape]).model).to(torch.bfloat16)

    def step() -> None:
        tokens = torch.randint(0, 2048, (8, 64))
        model(tokens).float().logsumexp(-1).mean().backward()

    for _ in range(WARM):
        step()
    start, began = allocated_bytes(), time.perf_counter()
    for _ in range(STEPS):
        step()
    seconds = (time.perf_counter() - began) / STEPS
    print(json.dumps({"MiB/step": (allocated_bytes() - start) / 2**20 / STEPS, "s/step": seconds}))


def side(kind: str, capped: bool) -> dict[str, float]:
    env = {**os.environ, **{name: str(CAPACITY if capped else 1024) for name in VARIABLES}}
    args = [sys.executable, "-m", "benchmarks.kernel_cache", "--run", kind]
    done = subprocess.run(args, capture_output=True, text=True, check=True, env=env)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    if sys.argv[1:2] == ["--run"]:
        one_run(sys.argv[2])
        return
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


if __name__ == "__main__":
    main()
