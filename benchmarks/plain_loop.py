"""A hand-written PyTorch training loop: what the runner's throughput is compared with.

The same model, data, global batch, optimizer and threads per process as `python -m runner
OVERRIDES`, none of the runner's machinery: a DataLoader, forward, loss, backward, the optimizer,
and the loss read back every step (as a loop that prints it does). Under torchrun it is plain
DistributedDataParallel over gloo, each rank taking its slice of every global batch as the runner's
data parallelism does. Rank 0 prints samples/s as the runner defines throughput: global batch /
mean loop interval (batch start to batch start) after the warm-up steps; every rank prints its
mean time of forward, loss, backward and optimizer step (with DDP, backward holds the gradients'
all-reduce: the runner's compute_time_s + comm_time_s).

Each rank's result is one JSON object. With PLAIN_LOOP_RESULTS=DIR in the environment every rank
writes it to DIR/rank_<r>.json (written whole, then renamed into place): what benchmarks.overhead
reads, since ranks that share one stdout can interleave their prints (under PYTHONUNBUFFERED=1 a
print is two writes, the text and its newline, and once gave `{rank 0}{rank 1}` on one line).
Without it, each rank prints `plain_loop rank <r>: {...}`, the whole line in one os.write.
Usage: .venv/bin/python -m benchmarks.plain_loop [override ...]
       .venv/bin/torchrun --nproc-per-node 2 -m benchmarks.plain_loop [override ...]
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from statistics import fmean

import torch
import torch.distributed as dist
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import DictConfig
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler

from runner import plain_loop
from runner.config import register_configs
from runner.config_dirs import CONF_DIR
from runner.metrics import COMPUTE_TIME, THROUGHPUT

RESULTS_ENV = "PLAIN_LOOP_RESULTS"  # a folder: each rank writes rank_<r>.json there
PREFIX = "plain_loop rank "  # without it, each rank's stdout line: `plain_loop rank <r>: {...}`


def result_file(folder: str | Path, rank: int) -> Path:
    return Path(folder) / f"rank_{rank}.json"


def report(out: dict[str, float | int], rank: int) -> None:
    """This rank's result where no other rank's can cut into it: its own file (written whole
    under another name, then renamed), or one line written by a single os.write."""
    text = json.dumps(out)
    folder = os.environ.get(RESULTS_ENV)
    if folder:
        done = result_file(folder, rank)
        partial = done.with_suffix(".partial")
        partial.write_text(text)
        os.replace(partial, done)
    else:
        sys.stdout.flush()
        os.write(sys.stdout.fileno(), f"{PREFIX}{rank}: {text}\n".encode())


def config(overrides: list[str]) -> DictConfig:
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=overrides)


def batches(cfg: DictConfig, world: int, rank: int) -> Iterator[tuple[torch.Tensor, ...]]:
    """This rank's slice of every global batch, epoch after epoch."""
    train = instantiate(cfg.data, _convert_="all").train
    if world > 1:
        sampler = DistributedSampler(train, world, rank, shuffle=True, seed=cfg.seed)
    else:
        sampler = RandomSampler(train, generator=torch.Generator().manual_seed(cfg.seed))
    loader = DataLoader(
        train, batch_size=cfg.data.batch_size // world, sampler=sampler, drop_last=True
    )
    for epoch in range(sys.maxsize):
        if world > 1:
            sampler.set_epoch(epoch)
        yield from loader


def train(cfg: DictConfig, world: int = 1, rank: int = 0) -> tuple[list[float], list[float]]:
    """Every step's start and its compute time (forward, loss, backward, optimizer step)."""
    torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // world))
    model, optimizer, loss_fn = plain_loop.build(cfg)
    if world > 1:  # the optimizer holds the same parameters, which DDP only wraps
        model = DistributedDataParallel(model, broadcast_buffers=False)
    starts, computes = [], []
    for index, (x, y) in enumerate(batches(cfg, world, rank)):
        if index == cfg.trainer.max_steps:
            break
        starts.append(time.perf_counter())
        begun = time.perf_counter()
        loss = plain_loop.step(model, optimizer, loss_fn, x, y)
        computes.append(time.perf_counter() - begun)  # with DDP, backward holds the all-reduce
        loss.item()
    return starts, computes


def samples_per_s(cfg: DictConfig, starts: list[float]) -> float:
    """Global batch / mean loop interval after the warm-up steps, as the runner's throughput."""
    intervals = [b - a for a, b in itertools.pairwise(starts[cfg.trainer.warmup_steps :])]
    return cfg.data.batch_size / fmean(intervals)


def main() -> None:
    cfg = config(sys.argv[1:])
    world, rank = int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("RANK", 0))
    if world > 1:
        dist.init_process_group("gloo")
    starts, computes = train(cfg, world, rank)
    warm = cfg.trainer.warmup_steps
    if world > 1:
        dist.destroy_process_group()
    # Every rank reports its own result, no collective at the end.
    # Under the runner's names: benchmarks.overhead reads both alike.
    out = {"rank": rank, COMPUTE_TIME.name: fmean(computes[warm:-1])}  # steps of counted intervals
    if rank == 0:
        out[THROUGHPUT.name] = samples_per_s(cfg, starts)
    report(out, rank)


if __name__ == "__main__":
    main()
