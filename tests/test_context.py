"""Context parallelism (parallel.cp): every sample's sequence split over the cp ranks, attention
a ring over them (runner/layouts/context/ring.py). Each layout equals the single-process run;
the ring's sends are counted (comm_bytes_per_step/cp) and equal the formula exactly, as the
other dimensions' bytes in the mesh do; bad layouts are refused before launch."""

from pathlib import Path

import pytest

from tests.helpers.in_process import Cli
from tests.helpers.jobs import QUICK, planned, train
from tests.helpers.layouts import assert_equal_and_counted, shown_on_timeline
from tests.helpers.records import loss_series

RELATIVE = 1e-5  # fp32: the ring's online softmax sums its blocks in another order
JOB = ["model=decoder", "model.d_model=32", "model.n_layers=2", "model.dropout=0",
       "model.context_len=32", "trainer.max_steps=6", "data.batch_size=8"]  # fmt: skip
LAYOUTS = {  # the layout's overrides -> the dimensions whose bytes it counts
    "cp=2": (["parallel=cp", "hardware.devices=2"], {"dp", "cp"}),
    "cp=4": (["parallel=cp", "hardware.devices=4"], {"dp", "cp"}),
    "dp=2 x cp=2": (["parallel=dp_cp"], {"dp", "cp"}),
    # FSDP2 shards over the replicas and their cp ranks, which sum gradients together
    "dp=2 x cp=2, sharded": (["parallel=dp_cp", "parallel.shard=full"], {"dp", "cp"}),
    "cp=2 x tp=2": (["parallel=cp", "parallel.tp=2", "hardware.devices=4"], {"dp", "cp", "tp"}),
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
        assert run.data.metrics["comm_busbw_gbs/cp"] > 0, name
        if name == "cp=2":  # the timeline shows the ring's exchanges and the waits for them
            for rank in (0, 1):
                shown = shown_on_timeline(store, run.info.run_id, tmp_path, rank)
                assert {"cp send-recv", "cp wait"} <= shown, rank


LLAMA_405B = [  # docs/planner.md's long-context plan: Llama 3 405B's layout at 131,072 tokens
    "mode=plan", "model=llama3_405b", "hardware=h100_cluster", "hardware.nodes=2048",
    "parallel.tp=8", "parallel.cp=16", "parallel.pp=16", "parallel.dp=8", "parallel.shard=full",
    "data.batch_size=128", "parallel.microbatches=16", "parallel.schedule=interleaved_1f1b",
    "parallel.virtual_stages=4", "trainer.precision=bf16-mixed", "trainer.recompute=full",
]  # fmt: skip


def test_the_ring_moves_what_its_steps_send() -> None:
    """Per block and micro-batch of b samples, K and V of b x s/cp x h/tp values each: cp-1 sends
    forward and again backward at 16 bits, and here once more recomputed; cp sends of their
    gradients at 32 bits; a pipeline rank holds 1/pp of the blocks. 405B: 16 samples a replica,
    s 131,072, h 16,384, 126 blocks."""
    b, s, h, t, cp, pp, layers = 16, 131072, 16384, 8, 16, 16, 126
    kv = 2 * b * (s // cp) * (h // t) * layers
    expected = (kv * (cp - 1) * 3 * 2 + kv * cp * 4) / pp
    out = planned(*LLAMA_405B)
    assert out["comm_bytes_per_step"]["cp"] == expected
    # the ring runs beside attention's products: most of its time is hidden, the rest shows
    hidden, shown = out["comm_hidden_s"]["cp"], out["comm_time_s"]["cp"]
    assert (round(hidden, 1), round(shown, 1)) == (13.1, 3.2)


def test_the_405b_at_131k_tokens_fits_with_context_parallelism_and_not_without() -> None:
    """docs/planner.md: 56.8 GiB a device at its peak (33.9 of activations, 16.0 of them the
    ring's working set) with cp 16; 286 GiB of activations without."""
    with_cp = planned(*LLAMA_405B)["mem_per_device_gib"]
    without = planned(*LLAMA_405B, "parallel.cp=1", "hardware.nodes=128")["mem_per_device_gib"]
    assert (round(with_cp["total"], 1), round(with_cp["activations"], 1)) == (56.8, 33.9)
    assert round(without["activations"]) == 286
