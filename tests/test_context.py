"""Context parallelism (parallel.cp): every sample's sequence split over the cp ranks, attention
a ring over them (runner/layouts/context/ring.py). Each layout equals the single-process run;
the ring's sends are counted (comm_bytes_per_step/cp) and equal the formula exactly, as the
other dimensions' bytes in the mesh do; bad layouts are refused before launch."""

from pathlib import Path

import pytest
import torch

from runner.layouts.context import ring
from runner.metrics import COMM_BUSBW, COMM_BYTES_PER_STEP, COMM_TIME
from tests.helpers.in_process import Cli
from tests.helpers.jobs import QUICK, planned, train
from tests.helpers.layouts import assert_equal_and_counted, shown_on_timeline
from tests.helpers.records import loss_series

RELATIVE = 1e-5  # fp32: the ring's online softmax sums its blocks in another order
# Grouped-query attention (4 query heads on 2 key/value heads) and an FFN 48 wide: each tensor rank
# holds one key/value head, and the ring carries K and V as they are (docs/parallelism.md's
# commands check multi-head attention's ring against one process)
JOB = ["model=decoder", "model.d_model=32", "model.n_layers=2", "model.dropout=0",
       "model.n_kv_heads=2", "model.ffn_hidden=48", "model.context_len=32",
       "trainer.max_steps=6", "data.batch_size=8"]  # fmt: skip
LAYOUTS = {  # the layout's overrides -> the dimensions whose bytes it counts
    "cp=2": (["parallel=cp", "hardware.devices=2"], {"dp", "cp"}),
    "cp=4": (["parallel=cp", "hardware.devices=4"], {"dp", "cp"}),
    "dp=2 x cp=2": (["parallel=dp_cp"], {"dp", "cp"}),
    # FSDP2 shards over the replicas and their cp ranks, which sum gradients together
    "dp=2 x cp=2, sharded": (["parallel=dp_cp", "parallel.shard=full"], {"dp", "cp"}),
    # sequence parallelism splits each cp rank's positions over its tp ranks (Megatron-LM's)
    "cp=2 x tp=2 + sp": (
        ["parallel=cp", "parallel.tp=2", "parallel.sequence_parallel=true", "hardware.devices=4"],
        {"dp", "cp", "tp", "sp"},
    ),
    "pp=2 x cp=2": (["parallel=cp", "parallel.pp=2", "hardware.devices=4"], {"dp", "cp", "pp"}),
    # the ring runs its forward once more, in backward; selective keeps DTensor's sums, not the
    # ring's sends: the same bytes
    "cp=2, full recomputation": (
        ["parallel=cp", "hardware.devices=2", "trainer.recompute=full"],
        {"dp", "cp"},
    ),
    "cp=2, selective recomputation": (
        ["parallel=cp", "hardware.devices=2", "trainer.recompute=selective"],
        {"dp", "cp"},
    ),
}


@pytest.mark.slow
def test_every_layout_equals_the_single_process_run_and_counts_its_sends(
    store: str, tmp_path: Path, cli: Cli
) -> None:
    single = loss_series(store, train(*JOB))
    for name, (layout, dims) in LAYOUTS.items():
        done = cli(*JOB, *QUICK, *layout, cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
        run = assert_equal_and_counted(store, single, name, dims, RELATIVE)
        assert run.data.metrics[COMM_BUSBW.at(dim="cp")] > 0, name
        if name == "cp=2":  # the timeline shows the ring's exchanges and the waits for them
            # per block: K and V of 8 samples x 16 positions x 16 values (2 heads of 8), sent
            # once forward and again backward, their gradients twice (cp), all at 32 bits
            kv = 2 * 8 * 16 * 16 * 4
            assert run.data.metrics[COMM_BYTES_PER_STEP.at(dim="cp")] == 2 * kv * (1 + 1 + 2)
            for rank in (0, 1):
                shown = shown_on_timeline(store, run.info.run_id, tmp_path, rank)
                assert {"cp send-recv", "cp wait"} <= shown, rank


@pytest.mark.parametrize("cp", [2, 4])
def test_the_ring_computes_every_visible_pair_and_half_of_each_other_ranks_block(cp: int) -> None:
    """Under the head-tail layout (32 positions), each rank's own block whole under its mask;
    every other rank's block a half, every pair of which its queries see."""
    positions = torch.tensor(ring.layout(32, cp))
    side = 32 // cp
    for index in range(cp):
        for j in range(cp):
            keys = positions[(index - j) % cp]
            visible = keys[None, :] <= positions[index][:, None]
            rows, cols, mask = ring.box(visible)
            inside = torch.zeros_like(visible)
            inside[rows, cols] = True if mask is None else mask
            assert torch.equal(inside, visible)  # nothing visible left out, nothing hidden in
            area = (rows.stop - rows.start) * (cols.stop - cols.start)
            assert area == (side * side if j == 0 else side * side // 2)
            assert (mask is None) == (j > 0)


LLAMA_405B = [  # docs/planner.md's long-context plan: Llama 3 405B's layout at 131,072 tokens
    "mode=plan", "model=llama3_405b", "hardware=h100_cluster", "hardware.nodes=2048",
    "parallel.tp=8", "parallel.cp=16", "parallel.pp=16", "parallel.dp=8", "parallel.shard=full",
    "data.batch_size=128", "parallel.microbatches=16", "parallel.schedule=interleaved_1f1b",
    "parallel.virtual_stages=4", "trainer.precision=bf16-mixed", "trainer.recompute=full",
]  # fmt: skip
# What mode=search finds for the same model, cluster and batch (docs/planner.md)
SEARCHED = ["parallel.dp=2", "parallel.cp=64", "parallel.microbatches=64",
            "parallel.schedule=zero_bubble", "parallel.shard=gradients",
            "parallel.sequence_parallel=true", "trainer.recompute=none"]  # fmt: skip


def test_the_ring_moves_what_its_steps_send() -> None:
    """Per block and micro-batch of b samples, K and V of b x s/cp x h_kv/tp values each (h_kv:
    8 key/value heads of 128 dimensions, grouped-query attention): cp-1 sends forward and again
    backward at 16 bits, and here once more recomputed; cp sends of their gradients at 32 bits;
    a pipeline rank holds 1/pp of the blocks. 405B: 16 samples a replica, s 131,072, 126
    blocks."""
    b, s, h_kv, t, cp, pp, layers = 16, 131072, 1024, 8, 16, 16, 126
    kv = 2 * b * (s // cp) * (h_kv // t) * layers
    expected = (kv * (cp - 1) * 3 * 2 + kv * cp * 4) / pp
    out = planned(*LLAMA_405B)
    assert out["comm_bytes_per_step"]["cp"] == expected
    # the ring runs beside attention's products: all of it hidden but every block's last
    # exchange of gradients, which nothing computes beside (the seconds themselves:
    # tests/regression/planner.yaml)
    hidden, shown = out["comm_hidden_s"]["cp"], out[COMM_TIME.name]["cp"]
    assert 0 < shown < hidden / cp


def test_the_405b_at_131k_tokens_outgrows_a_gpu_in_llamas_layout_but_not_in_the_searched_one() -> (
    None
):
    """docs/planner.md: Llama's layout, fully recomputed, peaks above an H100's 80 GB in this
    runner; without context parallelism its activations grow more than tenfold; the layout
    mode=search puts first fits (the GiB themselves: tests/regression/planner.yaml)."""
    llama = planned(*LLAMA_405B)["mem_per_device_gib"]
    without = planned(*LLAMA_405B, "parallel.cp=1", "hardware.nodes=128")["mem_per_device_gib"]
    searched = planned(*LLAMA_405B, *SEARCHED)["mem_per_device_gib"]
    assert searched["total"] < 80 < llama["total"]
    assert without["activations"] > 10 * llama["activations"]
