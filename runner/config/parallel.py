"""The parallel group: the device mesh and the layouts' settings. Its rules need the resolved
mesh and the model: each layout's live with it (runner/layouts/rules.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ParallelConfig:
    # The device mesh: data-parallel replicas x pipeline stages x context-parallel ranks x tensor-
    # parallel shards. One size may be null: it takes the processes the others leave
    # (runner/mesh.py).
    dp: int | None = 1
    pp: int | None = 1
    tp: int | None = 1
    # Context parallelism: every sample's sequence split over cp ranks for the whole model,
    # attention passing keys and values around a ring of them (runner/layouts/context/); the cp
    # ranks of a replica read the same samples and sum their gradients with the replicas'.
    cp: int | None = 1
    # Expert parallelism, for a model with experts (model=moe): n_experts / ep of them on each
    # rank, tokens sent to them and back by all-to-all; its ranks are data-parallel ones (ep
    # divides dp), which hold the rest of the model as replicas do
    ep: int = 1
    # DDP's gradient bucket size, one all-reduce per bucket; null: torch's default, 25 MiB after
    # a first bucket of 1 MiB, whose all-reduce starts while backward still runs
    bucket_cap_mb: float | None = None
    # Micro-batches per replica's share of the batch: a pipeline's (1: plain model parallelism),
    # or, with pp 1, gradient accumulation (a one-stage pipeline schedule). null: one per stage
    # (parallel.pp), as the default 1F1B schedule needs at least; 1 without a pipeline
    microbatches: int | None = None
    schedule: str = "1f1b"  # pipeline: one of runner.choices.SCHEDULES
    virtual_stages: int = 1  # pipeline: stages per rank (interleaved schedules)
    split: list[int] | None = None  # pipeline: layers per stage; None splits evenly
    # Split the vocabulary over the tensor-parallel ranks (Megatron-LM's vocab parallelism): the
    # embedding, the output layer and cross-entropy, for models that have one; others ignore it.
    # false: every tensor-parallel rank holds the whole embedding and computes every logit.
    vocab_parallel: bool = True
    # Megatron-LM's sequence parallelism, with tp > 1: the activations between the split layers
    # (norms, residual adds, dropout) split along the sequence over the tp ranks; an all-gather
    # before each column-parallel layer and a reduce-scatter after each row-parallel one replace
    # its all-reduce. Same bytes on the link, a tp-th of those activations held.
    sequence_parallel: bool = False
    # Sharded data parallelism over the dp ranks and their cp ranks (runner/layouts/sharded/):
    # none = DDP, every replica holds everything; gradients = ZeRO-2 (FSDP2, weights kept
    # from forward to the end of backward); optimizer = ZeRO-1, which runs as ZeRO-2 (Megatron's
    # distributed optimizer: gradients reduce-scattered, weights all-gathered); full = ZeRO-3 /
    # FSDP (weights gathered per block before use, freed after). One of
    # runner.choices.SHARDS; with dp x cp 1 there is nothing to shard over: it runs as none.
    shard: str = "none"
    # ZeRO-3 (shard=full) frees each unit's gathered weights after its forward and gathers them
    # again for its backward: always, or never (kept to the end of backward). Under gradient
    # accumulation, always runs each micro-batch as FSDP alone would (gathers, reduce-scatters
    # into the sharded gradients, frees); never keeps the weights and whole gradients across the
    # micro-batches (fewer gathers, more memory). default: always outside a pipeline, never in
    # one (torchtitan's). One of runner.choices.RESHARD.
    reshard_after_forward: str = "default"
    # Where weights stay gathered from forward to backward (shard=gradients, and optimizer over
    # 16-bit weights: Megatron's distributed optimizer), when the updated shards are gathered:
    # forward (unit by unit as the next forward reaches them, behind its compute) or step (all of
    # them right after the optimizer's step, exposed: Megatron-LM's default without
    # --overlap-param-gather). One of runner.choices.PARAM_GATHER.
    param_gather: str = "forward"
