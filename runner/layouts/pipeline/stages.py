"""A pipeline's stages: consecutive layers of the plain model on consecutive ranks, as the model's
spec splits it. Interleaved schedules give each rank `virtual_stages` stages, stage s on rank
s % P. Nothing here changes the model's modules: stages hold the very modules (and weights) the
single-process model would train.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import nn
from torch.distributed import pipelining

from runner.choices import SCHEDULES as NAMES
from runner.models.spec import ModelSpec

SCHEDULES = dict(
    zip(
        NAMES,
        (
            pipelining.ScheduleGPipe,
            pipelining.Schedule1F1B,
            pipelining.ScheduleInterleaved1F1B,
            pipelining.ScheduleInterleavedZeroBubble,
        ),
        strict=True,
    )
)


def stage_module(spec: ModelSpec, model: nn.Module, stage: int, stages: list[range]) -> nn.Module:
    """`stages`: each stage's layers (runner/models/sizes.py: stage_layers)."""
    last = len(stages) - 1
    return spec.stage_module(model, stages[stage], stage == 0, stage == last)


def by_whole_names(whole: nn.Module, parts: list[nn.Module]) -> nn.Module:
    """The modules of `parts` under the names they have in `whole`: a module that holds nothing
    itself, so that a snapshot keys each stage's weights as one process keys them. Holds the
    modules, not their parameters: what layouts put in their place later (DTensors, shards) is
    what it shows."""
    held = {id(m) for part in parts for m in part.modules()}
    if id(whole) in held:
        return whole
    view: nn.Module = nn.Module()
    taken: list[str] = []
    for name, module in whole.named_modules():
        if id(module) not in held or any(name.startswith(t + ".") for t in taken):
            continue
        taken.append(name)
        *path, leaf = name.split(".")
        parent = view
        for step in path:
            if not hasattr(parent, step):
                parent.add_module(step, nn.Module())
            parent = getattr(parent, step)
        parent.add_module(leaf, module)
    named = {id(p) for p in view.parameters()}
    stray = [p for part in parts for p in part.parameters() if id(p) not in named]
    if stray:  # a stage holding a weight of no module of the whole: a model's spec to fix
        raise RuntimeError(f"{len(stray)} of a stage's parameters have no name in the whole model")
    return view


def stage_examples(
    spec: ModelSpec,
    model: nn.Module,
    stage: int,
    stages: list[range],
    microbatch: int,
    seq_len: int,
) -> tuple:
    """A stage's input and output for one micro-batch, on the meta device. Given to PipelineStage,
    they spare the schedule from inferring them by running a forward, which it would do at every
    switch between training and evaluation (with tensor parallelism, collectives and all)."""
    layers, last = stages[stage], len(stages) - 1
    return spec.stage_example(model, layers, stage == 0, stage == last, microbatch, seq_len)


def stream_split(
    examples: tuple[torch.Tensor, torch.Tensor], first: bool, last: bool, tp: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequence parallelism: stages hand each other the stream as each tensor-parallel rank holds
    it, its positions (dimension 1) split tp ways; the data and the logits stay whole."""

    def split(t: torch.Tensor) -> torch.Tensor:
        shape = (t.shape[0], t.shape[1] // tp, *t.shape[2:])
        return torch.empty(shape, dtype=t.dtype, device="meta", requires_grad=t.requires_grad)

    x, out = examples
    return (x if first else split(x)), (out if last else split(out))


def sent_dtype(stage: int, stages: int, between: torch.dtype) -> torch.dtype:
    """What a stage hands on: what the model's layers hand each other (`between`), the last
    stage's output in fp32 for the loss (as autocast gives the loss). Fixed up front: the schedule
    allocates its receive buffers from the examples."""
    return torch.float32 if stage == stages - 1 else between


def in_context(part: nn.Module, context: Callable[[], AbstractContextManager]) -> None:
    """Run the stage's forward, and only its forward, in `context` (Lightning's autocast): the
    schedule runs backward too, which autocast must not wrap (torch's AMP notes)."""
    forward = part.forward

    def run(*args: Any, **kwargs: Any) -> Any:
        with context():
            return forward(*args, **kwargs)

    part.forward = run


def cast_output(part: nn.Module, dtype: torch.dtype) -> None:
    """Make the stage's output `dtype` (autocast leaves it as its last operation made it)."""
    part.register_forward_hook(lambda _module, _inputs, out: out.to(dtype))


def with_dtypes(
    examples: tuple[torch.Tensor, torch.Tensor], received: torch.dtype, sent: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """The examples' shapes with the dtypes the stage really receives (a float input) and sends."""

    def like(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        if not t.is_floating_point() or t.dtype == dtype:
            return t
        return torch.empty(t.shape, dtype=dtype, device="meta", requires_grad=t.requires_grad)

    x, out = examples
    return like(x, received), like(out, sent)


def stages_of(rank: int, world: int, virtual: int) -> list[int]:
    return [s for s in range(world * virtual) if s % world == rank]
