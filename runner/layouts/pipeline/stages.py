"""A pipeline's stages: consecutive layers of the plain model on consecutive ranks, as the model's
spec splits it. Interleaved schedules give each rank `virtual_stages` stages, stage s on rank
s % P. Nothing here changes the model's modules: stages hold the very modules (and weights) the
single-process model would train.
"""

from __future__ import annotations

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


def stages_of(rank: int, world: int, virtual: int) -> list[int]:
    return [s for s in range(world * virtual) if s % world == rank]
