"""Pipeline parallelism: consecutive stages of the plain model on consecutive ranks.

The FFNN splits by layers (a Linear and its activation), the decoder by blocks, the embedding on
the first stage and the (tied) output layer on the last. Interleaved schedules give each rank
`virtual_stages` stages, stage s on rank s % P. Nothing here changes the model's modules: stages
hold the very modules (and weights) the single-process model would train.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.distributed import pipelining

from runner.models.decoder import Decoder
from runner.models.ffnn import FFNN

SCHEDULES = {
    "gpipe": pipelining.ScheduleGPipe,
    "1f1b": pipelining.Schedule1F1B,
    "interleaved_1f1b": pipelining.ScheduleInterleaved1F1B,
    "zero_bubble": pipelining.ScheduleInterleavedZeroBubble,
}
MULTI_STAGE = {"interleaved_1f1b", "zero_bubble"}  # schedules that drive several stages per rank


class DecoderStage(nn.Module):
    """Blocks of the decoder; the first stage embeds, the last one projects to the vocabulary."""

    def __init__(self, model: Decoder, blocks: range, first: bool, last: bool) -> None:
        super().__init__()
        self.first, self.last, self.d_model = first, last, model.d_model
        self.embed = model.embed if first or last else None  # tied: the last stage's output layer
        if first:
            self.register_buffer("pos", model.pos, persistent=False)
            self.dropout = model.dropout
        self.blocks = nn.ModuleList(model.blocks[i] for i in blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:
            x = self.dropout(self.embed(x) * math.sqrt(self.d_model) + self.pos[: x.shape[1]])
        for block in self.blocks:
            x = block(x)
        return x @ self.embed.weight.T if self.last else x


def stage_module(model: nn.Module, stage: int, split: list[int]) -> nn.Module:
    start = sum(split[:stage])
    layers = range(start, start + split[stage])
    if isinstance(model, Decoder):
        return DecoderStage(model, layers, first=stage == 0, last=stage == len(split) - 1)
    if isinstance(model, FFNN):
        return nn.Sequential(*(model.layers[j] for i in layers for j in (2 * i, 2 * i + 1)))
    raise TypeError(f"no pipeline split for {type(model).__name__}")


def stage_examples(
    model: nn.Module, stage: int, split: list[int], microbatch: int, seq_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """A stage's input and output for one micro-batch, on the meta device. Given to PipelineStage,
    they spare the schedule from inferring them by running a forward, which it would do at every
    switch between training and evaluation (with tensor parallelism, collectives and all)."""
    start, stop = sum(split[:stage]), sum(split[: stage + 1])
    first, last = stage == 0, stage == len(split) - 1

    def activation(*shape: int) -> torch.Tensor:  # one that carries a gradient back
        return torch.empty(shape, device="meta", requires_grad=True)

    if isinstance(model, Decoder):
        hidden = (microbatch, seq_len, model.d_model)
        tokens = torch.empty(microbatch, seq_len, dtype=torch.long, device="meta")
        out = (microbatch, seq_len, model.embed.num_embeddings) if last else hidden
        return (tokens if first else activation(*hidden)), activation(*out)
    linears = [m for m in model.layers if isinstance(m, nn.Linear)]
    width_in, width_out = linears[start].in_features, linears[stop - 1].out_features
    x = (
        torch.empty(microbatch, width_in, device="meta")
        if first
        else activation(microbatch, width_in)
    )
    return x, activation(microbatch, width_out)


def stages_of(rank: int, world: int, virtual: int) -> list[int]:
    return [s for s in range(world * virtual) if s % world == rank]
