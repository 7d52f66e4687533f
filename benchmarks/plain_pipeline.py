"""A pipeline of 2 stages with none of the runner's machinery: what its pipeline's step is compared
with (benchmarks/pipeline_cost.py).

The config's model, optimizer, loss and global batches as `python -m runner OVERRIDES` builds them
(parallel.pp=2 cuts it into the same stages), one thread a rank, gloo. Two ways to run a step:
- `schedule`: torch.distributed.pipelining's schedule (parallel.schedule) over PipelineStages,
  then the optimizer: what the runner's strategy drives, without Lightning, probes or tracking;
- `loop`: a hand-written GPipe, every micro-batch's forward then every backward, each activation
  and gradient one isend/irecv pair, receives posted when the work needs them.
Each rank times every step's loop interval (batch start to batch start) and its actions: forward,
backward, and the time blocked receiving; rank 0 reports them as one JSON line (`plain_pipeline:
{...}`), means after the warm-up steps.
Usage: .venv/bin/torchrun --nproc-per-node 2 -m benchmarks.plain_pipeline {schedule|loop} \
       [override ...]
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from statistics import fmean
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage

from benchmarks.plain_loop import batches, config
from runner import plain_loop
from runner.layouts.pipeline.stages import SCHEDULES, stage_examples, stage_module
from runner.losses import LOSSES
from runner.models.registry import spec_for
from runner.models.sizes import stage_layers

PREFIX = "plain_pipeline: "
Timed = dict[str, list[float]]  # an action's kind -> its durations this step


def timed(fn: Callable, kind: str, times: Timed) -> Callable:
    def run(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        out = fn(*args, **kwargs)
        times[kind].append(time.perf_counter() - start)
        return out

    return run


def with_schedule(cfg: Any, model: nn.Module, part: nn.Module, rank: int, times: Timed) -> Callable:
    """A step of torch's schedule: forward and backward timed where the stage runs them, the
    waits where the schedule waits for its receives."""
    from torch.distributed.pipelining import schedules

    layers, p = stage_layers(cfg.model, cfg.parallel), cfg.parallel
    microbatch = cfg.data.batch_size // p.microbatches
    spec = spec_for(cfg.model)
    x, out = stage_examples(spec, model, rank, layers, microbatch, 0)
    stage = PipelineStage(part, rank, 2, torch.device("cpu"), x, out)
    stage.forward_one_chunk = timed(stage.forward_one_chunk, "forward", times)
    stage.backward_one_chunk = timed(stage.backward_one_chunk, "backward", times)
    schedules._wait_batch_p2p = timed(schedules._wait_batch_p2p, "wait", times)
    schedule = SCHEDULES[p.schedule](
        stage, n_microbatches=p.microbatches, loss_fn=LOSSES[cfg.data.loss], scale_grads=True
    )

    def step(xb: torch.Tensor, yb: torch.Tensor) -> None:
        if rank == 0:
            schedule.step(xb)
        else:
            schedule.step(target=yb)

    return step


def with_loop(
    cfg: Any, part: nn.Module, rank: int, times: Timed, example: torch.Tensor
) -> Callable:
    """A hand-written GPipe step over isend/irecv; `example`: the activation a micro-batch hands
    the second stage."""
    m, loss_fn, peer = cfg.parallel.microbatches, LOSSES[cfg.data.loss], 1 - rank

    def wait(work: dist.Work) -> None:
        start = time.perf_counter()
        work.wait()
        times["wait"].append(time.perf_counter() - start)

    def step(xb: torch.Tensor, yb: torch.Tensor) -> None:
        xs, ys = xb.chunk(m), yb.chunk(m)
        inputs, outputs, sends = [], [], []
        for i in range(m):
            start = time.perf_counter()
            if rank == 0:
                out = part(xs[i])
                sends.append(dist.isend(out.detach(), peer))
            else:
                got = torch.empty_like(example)
                wait(dist.irecv(got, peer))
                start = time.perf_counter()
                got.requires_grad_()
                inputs.append(got)
                out = loss_fn(part(got), ys[i]) / m
            outputs.append(out)
            times["forward"].append(time.perf_counter() - start)
        for i in range(m):
            if rank == 0:
                grad = torch.empty_like(outputs[i])
                wait(dist.irecv(grad, peer))
                start = time.perf_counter()
                outputs[i].backward(grad)
            else:
                start = time.perf_counter()
                outputs[i].backward()
                sends.append(dist.isend(inputs[i].grad, peer))
            times["backward"].append(time.perf_counter() - start)
        for work in sends:
            work.wait()

    return step


def shapes(cfg: Any, part: nn.Module, rank: int) -> torch.Tensor:
    """The activation a micro-batch hands the second stage: rank 1 learns its shape from rank 0
    once, as a hand-written loop would."""
    size = torch.zeros(2, dtype=torch.int64)
    if rank == 0:
        xb, _ = next(iter(batches(cfg, 1, 0)))
        with torch.no_grad():
            size[:] = torch.tensor(part(xb.chunk(cfg.parallel.microbatches)[0]).shape)
    dist.broadcast(size, 0)
    return torch.empty(tuple(size.tolist()))


def main() -> None:
    how, cfg = (
        sys.argv[1],
        config(["parallel=pipeline", "parallel.pp=2", "hardware.devices=2", *sys.argv[2:]]),
    )
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model, optimizer, _ = plain_loop.build(cfg)  # steps the weights with gradients: this stage's
    spec, layers = spec_for(cfg.model), stage_layers(cfg.model, cfg.parallel)
    part = stage_module(spec, model, rank, layers)
    times: Timed = defaultdict(list)
    if how == "schedule":
        step = with_schedule(cfg, model, part, rank, times)
    else:
        step = with_loop(cfg, part, rank, times, shapes(cfg, part, rank))
    warm, starts, per_step = cfg.trainer.warmup_steps, [], []
    for index, (xb, yb) in enumerate(batches(cfg, 1, 0)):
        if index == cfg.trainer.max_steps:
            break
        starts.append(time.perf_counter())
        optimizer.zero_grad()
        step(xb, yb)
        optimizer.step()
        per_step.append({k: sum(v) for k, v in times.items()})
        times.clear()
    intervals = [b - a for a, b in zip(starts[warm:], starts[warm + 1 :], strict=False)]
    mine = {"step_s": fmean(intervals)}
    mine |= {f"{k}_s": fmean(s.get(k, 0.0) for s in per_step[warm:]) for k in per_step[-1]}
    everyone: list[Any] = [None, None]
    dist.all_gather_object(everyone, mine)
    if rank == 0:
        print(PREFIX + json.dumps(everyone), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
