"""mode=search: how fast it prices layouts, and where it puts what people chose.

1. Speed: every layout of GPT-3 175B on 128 DGX H100 nodes (1,024 GPUs), global batch 1,536,
   bf16-mixed, the search's default grid, in this process (runner/modes/search.py: `search`).
   Reported apart, as the search spends on each: the layouts the rules refuse (asked, not
   priced), those priced and refused by memory (their memory alone), and those priced whole (they
   fit: memory, time and cost); the rules' verdicts are timed on their own pass. Layouts priced a
   second (the last two kinds over the search's time less the rules'), target > 1,000. The
   speed-up compares like with like: a sample of the layouts the search priced (those refused by
   memory and those that fit, in the search's proportions), priced as the search prices them (one
   memo shared across the sample; memory alone for a layout that does not fit) against one full
   plan each (runner/planner: `plan`, no work shared), in the same run.
2. Megatron-LM's Table 1 (benchmarks/published.py): each row searched on its cluster and batch;
   where the published mesh (tp x pp x dp) ranks among the meshes that fit, each at its best
   layout, and how much slower than the best it is planned. Twice: the full grid, and the grid
   of what Megatron-LM ran then (full recomputation, no sequence or context parallelism, no
   sharding, no zero-bubble schedule; Narayanan et al. 2021). docs/planner.md ("Which layout?")
   keeps the table.
Usage: .venv/bin/python -m benchmarks.search
"""

from __future__ import annotations

import dataclasses
import gc
import random
import time

from omegaconf import OmegaConf

from benchmarks.common import ratio_line
from benchmarks.plain_loop import config
from benchmarks.published import TABLE_1, Row, overrides
from runner.config.search import SearchConfig
from runner.job import Job, resolve_job, typed
from runner.modes.search import Searched, search
from runner.planner import plan
from runner.search.choose import ranked
from runner.search.price import job_of, price
from runner.search.space import View, layouts, verdicts
from runner.validate import device_memory_gib, validate

GPT3 = ["mode=search", "model=gpt3_175b", "hardware=h100_cluster", "hardware.nodes=128",
        "data.batch_size=1536", "trainer.precision=bf16-mixed"]  # fmt: skip
SAMPLE = 300  # layouts planned one by one for the baseline
THEN = ["search.recompute=[full]", "search.sequence_parallel=[false]", "search.cp=[1]",
        "search.shard=[none]", "search.schedule=[gpipe,1f1b,interleaved_1f1b]"]  # fmt: skip


def searched(args: list[str]) -> tuple[Job, Searched]:
    cfg = config(args)
    validate(cfg)
    job = resolve_job(cfg)
    return job, search(cfg, job, typed(SearchConfig, cfg.search))


def speed() -> tuple[float, float]:
    """(layouts priced a second, speed-up over a plan per layout on the same fitting layouts)."""
    job, found = searched(GPT3)
    cfg = config(GPT3)
    validate(cfg)
    base = View(OmegaConf.to_container(cfg, resolve=True))
    candidates = list(layouts(typed(SearchConfig, cfg.search), base.hardware, job.spec,
                              job.batch_size))  # fmt: skip
    start = time.perf_counter()
    for _ in verdicts(candidates, base):
        pass
    rules_s = time.perf_counter() - start
    fit = [p.layout for p in found.priced if p.fits]
    memory = len(found.priced) - len(fit)
    priced_s = max(found.seconds - rules_s, 1e-9)
    rate = len(found.priced) / priced_s
    print(f"GPT-3 175B on 1,024 H100s: {found.total:,} layouts in {found.seconds:.1f} s: "
          f"{len(found.refused):,} refused by the rules ({rules_s:.1f} s for every verdict), "
          f"{memory:,} priced and refused by memory, {len(fit):,} priced whole (they fit); "
          f"{rate:,.0f} priced a second")  # fmt: skip
    sample = random.Random(0).sample([p.layout for p in found.priced], SAMPLE)
    # Both sides below in a process that holds the whole search: out of the collector's sight,
    # so that its full collections, set off by either side's allocations, time neither
    gc.collect()
    gc.freeze()
    shared, have = dataclasses.replace(job, memo={}), device_memory_gib(job.hardware)
    start = time.perf_counter()
    for layout in sample:
        price(shared, layout, have)
    searched_s = (time.perf_counter() - start) / SAMPLE
    start = time.perf_counter()
    for layout in sample:
        plan(job_of(job, layout))
    alone = (time.perf_counter() - start) / SAMPLE
    print(f"{SAMPLE} priced layouts: {searched_s * 1e3:.2f} ms each priced as the search does, "
          f"{alone * 1e3:.2f} ms each planned alone")  # fmt: skip
    return rate, alone / searched_s


def published_rank(row: Row, grid: list[str]) -> tuple[int, int, float]:
    """(the published mesh's place among the meshes that fit, 1 first; how many; its planned
    step time over the best's)."""
    args = [o for o in overrides(row) if not o.startswith(("parallel.", "mode="))]
    _, found = searched([*args, "mode=search", *grid])
    best: dict[tuple[int, ...], float] = {}
    for p in ranked(found.priced, "time"):
        best.setdefault((p.layout.dp, p.layout.pp, p.layout.cp, p.layout.tp), p.step_time_s)
    mine = (row.gpus // (row.tp * row.pp), row.pp, 1, row.tp)
    order = list(best)
    return order.index(mine) + 1, len(order), best[mine] / best[order[0]]


def table() -> list[float]:
    lines = ["| params (B) | GPUs | published t x p x d | full grid: place | of | slower | "
             "2021's grid: place | of | slower |",
             "|---:|---:|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    shares = []
    for row in TABLE_1:
        dp = row.gpus // (row.tp * row.pp)
        now, then = published_rank(row, []), published_rank(row, THEN)
        shares.append((now[0] - 1) / now[1])  # the share of meshes planned faster
        lines.append(
            f"| {row.params_b:,.1f} | {row.gpus:,} | {row.tp} x {row.pp} x {dp} | {now[0]} | "
            f"{now[1]} | {now[2] - 1:+.1%} | {then[0]} | {then[1]} | {then[2] - 1:+.1%} |"
        )
    print("\n".join(lines))
    return shares


def main() -> None:
    rate, speedup = speed()
    shares = table()
    top = sum(s <= 0.05 for s in shares)
    print(f"published mesh among the best 5 % of meshes (no more than 5 % planned faster; full "
          f"grid): {top} of {len(shares)} rows")  # fmt: skip
    print(ratio_line("search: layouts priced a second", rate, "> 1000"))
    print(ratio_line("search: speed-up over a plan per layout", speedup, "> 5"))


if __name__ == "__main__":
    main()
