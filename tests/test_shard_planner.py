"""The planner's sharded data parallelism (parallel.shard): each level's collectives, their bytes
on the wire and their exposure, and the memory each level saves, against arithmetic from the
models' shapes (runner/layouts/sharded/traffic.py). Planned only: no process starts."""

import pytest

from runner import validate
from runner.job import resolve_job
from runner.metrics import (
    COMM_BYTES_BY_COLLECTIVE,
    COMM_BYTES_PER_STEP,
    COMM_TIME,
    PLAN_STEP_TIME,
    prediction,
)
from runner.planner import plan, predict
from runner.planner.hardware import tier, transfer_s
from runner.planner.memory import GIB
from tests.helpers.jobs import compose_job

# The default decoder: d_model 128, 2 blocks, vocabulary 2048. A block: Q, K, V and the output
# projection (d x d, biases), two LayerNorms (2d each), up (d x 4d, bias 4d), down (4d x d, bias d).
D = 128
BLOCK = 4 * (D * D + D) + 2 * 2 * D + (4 * D * D + 4 * D) + (4 * D * D + D)
EMB = 2048 * D  # tied: the embedding is the output layer
DECODER_P = 4 * (EMB + 2 * BLOCK)  # fp32 bytes a replica holds
# The default FFNN on 8x8 digits: 64 -> 64 -> 32 -> 10, a weight and a bias each.
FFNN_P = 4 * ((64 * 64 + 64) + (64 * 32 + 32) + (32 * 10 + 10))

DECODER = ["model=decoder", "parallel=data", "hardware.devices=4", "data.batch_size=32"]
FFNN = ["model=ffnn", "parallel=data", "hardware.devices=4", "data.batch_size=64"]


def job_of(*overrides: str):  # noqa: ANN201 - a Job
    cfg, _ = compose_job("mode=plan", *overrides)
    validate.validate(cfg)
    return resolve_job(cfg)


def test_the_decoders_collectives_per_level() -> None:
    assert BLOCK == 198_272 and DECODER_P == 2_634_752  # 658,688 parameters
    moved = {level: plan(job_of(*DECODER, f"parallel.shard={level}")) for level in
             ("none", "optimizer", "gradients", "full")}  # fmt: skip
    assert moved["none"]["comm_bytes_per_step"]["dp"] == DECODER_P
    assert moved["none"]["comm_bytes_by_collective"] == {}
    # ZeRO-2, and ZeRO-1 as Megatron's distributed optimizer: all gathered in forward,
    # reduce-scattered in backward, no all-reduce.
    for level in ("optimizer", "gradients"):
        assert moved[level]["comm_bytes_by_collective"] == {
            "dp/all_gather": DECODER_P, "dp/reduce_scatter": DECODER_P,
        }  # fmt: skip
    # ZeRO-3: the blocks gathered again for backward; the root's embedding stays gathered.
    assert moved["full"]["comm_bytes_by_collective"] == {
        "dp/all_gather": DECODER_P + 4 * 2 * BLOCK, "dp/reduce_scatter": DECODER_P,
    }  # fmt: skip
    assert moved["full"]["comm_bytes_per_step"]["dp"] == 3 * DECODER_P - 4 * EMB


def test_calls_are_units_for_every_sharded_level() -> None:
    calls = {
        level: resolve_calls(*DECODER, f"parallel.shard={level}")
        for level in ("optimizer", "gradients", "full")
    }
    assert (
        calls["optimizer"] == calls["gradients"] == 2 * 3
    )  # the root (embedding) and 2 blocks, gathered, scattered
    assert calls["full"] == 2 * 3 + 2  # and the blocks again for backward
    assert resolve_calls(*FFNN, "parallel.shard=full") == 3 * 3  # 3 Linear units, no root


def resolve_calls(*overrides: str) -> float:
    from runner.layouts import traffic

    return traffic(job_of(*overrides)).calls["dp"]


def test_full_over_micro_batches_moves_each_ones_or_keeps_what_gradients_keeps() -> None:
    """ZeRO-3 with 2 micro-batches: resharding (the default outside a pipeline) moves one
    micro-batch's step twice and holds its weights (the root and two blocks of four); keeping
    moves and holds what ZeRO-2 does."""
    accumulate = [*DECODER, "model.n_layers=4", "parallel.microbatches=2"]
    kept = plan(job_of(*accumulate, "parallel.shard=full", "parallel.reshard_after_forward=never"))
    gradients = plan(job_of(*accumulate, "parallel.shard=gradients"))
    assert kept["comm_bytes_by_collective"] == gradients["comm_bytes_by_collective"]
    assert kept["mem_per_device_gib"] == gradients["mem_per_device_gib"]
    each = plan(job_of(*accumulate, "parallel.shard=full"))
    once = plan(job_of(*DECODER, "model.n_layers=4", "parallel.shard=full"))
    moved = {k: 2 * v for k, v in once["comm_bytes_by_collective"].items()}
    assert each["comm_bytes_by_collective"] == moved
    assert each["mem_per_device_gib"]["weights"] == once["mem_per_device_gib"]["weights"]
    assert each["mem_per_device_gib"]["weights"] < kept["mem_per_device_gib"]["weights"]


def test_gathering_after_the_step_moves_the_same_bytes_with_nothing_beside_them() -> None:
    """parallel.param_gather=step (Megatron's distributed optimizer without overlapping its
    gather with the next forward): the same collectives, exposed whole after the step."""
    zero2 = [*DECODER, "parallel.shard=gradients"]
    forward, step = (
        plan(job_of(*zero2, f"parallel.param_gather={g}")) for g in ("forward", "step")
    )
    assert step["comm_bytes_by_collective"] == forward["comm_bytes_by_collective"]
    assert step[PLAN_STEP_TIME.name] > forward[PLAN_STEP_TIME.name]


def test_training_logs_each_collective_beside_the_dp_total() -> None:
    out = predict(job_of(*FFNN, "parallel.shard=full"))
    assert (
        out[prediction(COMM_BYTES_BY_COLLECTIVE.at(collective="all_gather"))] == 2 * FFNN_P
    )  # no root: all again
    assert out[prediction(COMM_BYTES_BY_COLLECTIVE.at(collective="reduce_scatter"))] == FFNN_P
    assert out[prediction(COMM_BYTES_PER_STEP.at(dim="dp"))] == 3 * FFNN_P
    assert not any("/dp/" in k for k in predict(job_of(*FFNN)))


def test_bus_bytes_zero3_one_and_a_half_ddps_zero1_and_2_one() -> None:
    """All-gather and reduce-scatter put (n-1)/n of S on each rank's link, an all-reduce
    2(n-1)/n: ZeRO-3's 3 x (n-1)/n P is 1.5 x DDP's at any n; ZeRO-1 and ZeRO-2 move one
    all-reduce's worth, as Megatron's distributed optimizer does."""

    def ring(*overrides: str) -> float:
        return predict(job_of(*overrides))["pred/ring_bytes_per_step/dp"]

    ddp = ring(*FFNN)
    assert ddp == pytest.approx(2 * 3 / 4 * FFNN_P)
    assert ring(*FFNN, "parallel.shard=full") == pytest.approx(1.5 * ddp)
    assert ring(*FFNN, "parallel.shard=gradients") == pytest.approx(ddp)
    assert ring(*FFNN, "parallel.shard=optimizer") == pytest.approx(ddp)
    # The decoder's embedding, kept gathered, is not gathered again: less than 1.5 x.
    assert ring(*DECODER, "parallel.shard=full") / ring(*DECODER) == pytest.approx(
        (3 * DECODER_P - 4 * EMB) / (2 * DECODER_P)
    )


def test_zero1_plans_as_zero2_in_every_precision() -> None:
    for precision in ("32-true", "bf16-mixed", "bf16-true"):
        zero = [*DECODER, f"trainer.precision={precision}"]
        zero1, zero2 = (
            plan(job_of(*zero, f"parallel.shard={level}")) for level in ("optimizer", "gradients")
        )
        assert zero1 == zero2


def test_fsdp_shows_only_its_first_gathers_and_last_scatters_behind_a_long_step() -> None:
    """A large batch computes long enough to hide all else: the root's and the first block's
    all-gathers before forward starts, and their reduce-scatters after backward ends, show."""
    job = job_of(*DECODER[:-1], "data.batch_size=1024", "parallel.shard=gradients")
    link, edge = tier(job.hardware, job.mesh, "dp"), 3 / 4 * 4 * (EMB + BLOCK)
    out = plan(job)
    assert out[COMM_TIME.name]["dp"] == pytest.approx(2 * transfer_s(link, 2, edge))
    whole = 2 * transfer_s(link, 3, 3 / 4 * DECODER_P)
    assert out[COMM_TIME.name]["dp"] + out["comm_hidden_s"]["dp"] == pytest.approx(whole)


def test_memory_falls_level_by_level() -> None:
    layers = 8  # two blocks gathered of eight: ZeRO-3 saves weights too
    deeper = [*DECODER, f"model.n_layers={layers}"]
    mem = {
        level: plan(job_of(*deeper, f"parallel.shard={level}"))["mem_per_device_gib"]
        for level in ("none", "optimizer", "gradients", "full")
    }
    # ZeRO-1 runs as ZeRO-2. ZeRO-3 gathers two blocks at a time.
    peak = {level: m["total"] for level, m in mem.items()}
    assert peak["none"] > peak["gradients"] == peak["optimizer"] > peak["full"]
    params = EMB + layers * BLOCK
    assert mem["none"]["optimizer_state"] == pytest.approx(8 * params / GIB)  # AdamW's moments
    assert mem["gradients"]["optimizer_state"] == pytest.approx(8 * params / 4 / GIB)
    # A quarter of them, and the largest unit's whole (the embedding) twice: as backward makes it
    # and as the reduce-scatter's input.
    assert mem["gradients"]["gradients"] == pytest.approx(4 * (params / 4 + 2 * EMB) / GIB)
    assert mem["gradients"]["weights"] == pytest.approx(4 * params * (1 + 1 / 4) / GIB)
    # ZeRO-3: its shards, the embedding gathered (the root), two blocks gathered.
    held = params / 4 + EMB + 2 * BLOCK
    assert mem["full"]["weights"] == pytest.approx(4 * held / GIB)


def test_one_replica_has_nothing_to_shard() -> None:
    alone = ["model=decoder", "parallel.shard=full"]
    assert plan(job_of(*alone)) == plan(job_of("model=decoder"))


def test_an_unknown_level_is_refused() -> None:
    cfg, _ = compose_job(*DECODER, "parallel.shard=bogus")
    with pytest.raises(validate.ConfigError) as error:
        validate.validate(cfg)
    assert error.value.key == "parallel.shard"


def test_gpt3_fits_sharded_that_does_not_fit_replicated() -> None:
    """175 B parameters on 64 replicas of 8-way tensor parallelism: DDP holds 16 bytes a
    parameter over 8, ZeRO-3 about a 64th of it, for about three times DDP's dp payload (P
    gathered twice, but the embedding once, and P reduce-scattered)."""
    base = ["model=gpt3_175b", "hardware=h100_cluster", "hardware.nodes=64", "parallel.tp=8",
            "parallel.dp=null", "data.batch_size=64", "trainer.precision=bf16-mixed",
            "trainer.recompute=full"]  # fmt: skip
    cfg, _ = compose_job("mode=plan", *base)
    none, full = plan(job_of(*base)), plan(job_of(*base, "parallel.shard=full"))
    memory = cfg.hardware.memory_gib
    assert none["mem_per_device_gib"]["total"] > memory > full["mem_per_device_gib"]["total"]
    assert 2.9 < full["comm_bytes_per_step"]["dp"] / none["comm_bytes_per_step"]["dp"] < 3
