"""Mixed precision, measured memory and MFU: every layout in bf16-mixed equals the single process
in bf16-mixed and moves the bytes the planner says; compiling changes no loss; every run logs its
peak memory and MFU beside the planner's."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient

from runner import validate as validate_module
from runner.autocast import ACTIVATIONS
from runner.choices import PRECISIONS
from runner.job import Job, resolve_job
from runner.layouts.pipeline.traffic import tied_share
from runner.metrics import (
    COMM_BYTES_BY_COLLECTIVE,
    COMM_BYTES_PER_STEP,
    MFU,
    PEAK_ALLOCATED,
    PEAK_MEMORY,
    STEP_TIME,
    prediction,
)
from runner.planner import plan, predict
from runner.planner.memory import largest_unit, memory_per_device_gib, params_per_device
from runner.precision import BY_NAME
from runner.validate import validate
from tests.helpers.in_process import Cli
from tests.helpers.jobs import QUICK, compose_job, train
from tests.helpers.records import all_runs, loss_series, losses_by_step

STEPS = 6  # the claims (equal losses, bytes as planned) hold from the first step
COMMON = [f"trainer.max_steps={STEPS}", "data.batch_size=16"]
DECODER = ["model=decoder", "model.d_model=32", "model.n_layers=2", "model.dropout=0"]
FFNN = ["model=ffnn", "model.hidden=[64,64,64]"]
BF16 = "trainer.precision=bf16-mixed"
TRUE = "trainer.precision=bf16-true"
HALF_REDUCE = "trainer.grad_reduce=bf16"
# bf16's unit roundoff, 2^-9: layouts add partial sums in other places than one process does
# (tensor parallelism all-reduces 16-bit partial outputs that one process sums in fp32 inside a
# matmul), so an activation may differ by one rounding. Measured here: the decoder's losses (an
# fp32 residual stream) within 5e-5, the FFNN's (16-bit throughout) within 3e-4. In fp32 the same
# layouts agree to 1e-5.
BF16_RELATIVE = 2**-9


def test_every_precision_has_its_figures() -> None:
    assert tuple(BY_NAME) == tuple(ACTIVATIONS) == PRECISIONS


def job_of(*overrides: str) -> Job:
    cfg, _ = compose_job(*overrides)
    validate(cfg)  # fills in the mesh
    return resolve_job(cfg)


def fp32_prediction(*overrides: str) -> dict[str, float]:
    return predict(job_of(*overrides))


@pytest.mark.slow
def test_bf16_mixed_on_every_layout_equals_one_process_in_bf16(
    store: str, tmp_path: Path, cli: Cli
) -> None:
    decoder = [*DECODER, *COMMON]
    single = loss_series(store, train(*decoder, BF16))
    assert single != loss_series(store, train(*decoder))  # autocast changed the arithmetic
    # dp x pp and pp x tp in bf16-mixed: their parts here, the FFNN's pp x tp below, and both
    # meshes over 16-bit weights (fsdp_3d's parts) in the bf16-true test
    for job, presets in (
        ([*decoder, "hardware.devices=2"], "data,tensor,tp_sp,cp,pipeline"),
        (decoder, "dp_tp"),
    ):
        done = cli("-m", *job, *QUICK, BF16, f"parallel={presets}", cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
    runs = [r for r in all_runs(store) if r.data.tags.get("world_size", "1") != "1"]
    assert len(runs) == 6
    for run in runs:
        m, layout = run.data.metrics, run.data.tags["parallel"]
        layout += " + sp" if run.data.params["parallel.sequence_parallel"] == "True" else ""
        assert losses_by_step(store, run.info.run_id) == pytest.approx(single, rel=BF16_RELATIVE)
        moved = {k for k in m if k.startswith("comm_bytes_per_step/")}
        assert moved and all(m[k] == m[f"pred/{k}"] for k in moved), layout
        for dim in {k.split("/")[1] for k in moved}:  # the bandwidth the transfers delivered
            assert m[f"comm_busbw_gbs/{dim}"] > 0 and m[f"pred/comm_busbw_gbs/{dim}"] == 1.5
    # Autocast ran inside the split layers: the blocks' forward all-reduces are 16-bit, the
    # backward ones fp32 (gradients of the fp32 residual stream), 3/4 of the bytes of fp32
    # training. The split vocabulary's are fp32 at every precision: the embedding runs outside
    # autocast, its output layer's input gradient joins the stream, the loss takes fp32 logits.
    tensor, sequence = sorted(
        (r for r in runs if r.data.tags["parallel"] == "tensor"),
        key=lambda r: r.data.params["parallel.sequence_parallel"],
    )  # "False" < "True"
    tp_run = [*decoder, "parallel=tensor", "hardware.devices=2"]
    key = prediction(COMM_BYTES_PER_STEP.at(dim="tp"))
    full = fp32_prediction(*tp_run)[key]
    blocks = fp32_prediction(*tp_run, "parallel.vocab_parallel=false")[key]
    assert 0 < full - blocks < blocks
    assert tensor.data.metrics[COMM_BYTES_PER_STEP.at(dim="tp")] == blocks * 3 / 4 + (full - blocks)
    # Sequence parallelism gathers and scatters twice the blocks' all-reduce payload, at the same
    # precisions (3/4 of fp32's); where the stream is split and gathered at the ends, fp32
    twice = 2 * blocks
    fp32_sp = fp32_prediction(*tp_run, "parallel.sequence_parallel=true")[f"{key[:-2]}sp"]
    assert sequence.data.metrics[COMM_BYTES_PER_STEP.at(dim="sp")] == twice * 3 / 4 + (
        fp32_sp - twice
    )


@pytest.mark.slow
def test_bf16_true_on_every_layout_it_trains_equals_one_process_in_bf16_true(
    store: str, tmp_path: Path, cli: Cli
) -> None:
    """16-bit weights over fp32 masters (FSDP2's mixed precision on every replica): the same
    bound as bf16-mixed's, for the same reason (partial sums added in other places), and every
    byte as planned: FSDP gathers 16-bit weights, sequence parallelism and the pipeline's stages
    16-bit activations (half of fp32's, where autocast sends the decoder's fp32 stream)."""
    decoder = [*DECODER, *COMMON]
    single = loss_series(store, train(*decoder, TRUE))
    assert single != loss_series(store, train(*decoder, BF16))  # not autocast's arithmetic
    for job in (
        [*decoder, "hardware.devices=2", "parallel=fsdp,tp_sp,pipeline"],
        [*decoder, "hardware.devices=2", "parallel=cp", "parallel.shard=full", HALF_REDUCE],
        [*decoder, "parallel=fsdp_tp"],
        # Megatron's distributed optimizer gathering the updated weights right after its step
        [
            *decoder,
            "hardware.devices=2",
            "parallel=data",
            "parallel.shard=optimizer",
            "parallel.param_gather=step",
        ],
    ):
        done = cli("-m", *job, *QUICK, TRUE, cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
    runs = {
        (r.data.tags["parallel"], r.data.params["parallel.shard"]): r
        for r in all_runs(store)
        if r.data.tags.get("world_size", "1") != "1"
    }
    assert len(runs) == 6
    for layout, run in runs.items():
        m = run.data.metrics
        assert losses_by_step(store, run.info.run_id) == pytest.approx(single, rel=BF16_RELATIVE)
        moved = {k for k in m if k.startswith("comm_bytes_per_step/")}
        assert moved and all(m[k] == m[f"pred/{k}"] for k in moved), layout
    gather, sp = (
        COMM_BYTES_BY_COLLECTIVE.at(collective="all_gather"),
        COMM_BYTES_PER_STEP.at(dim="sp"),
    )
    fsdp = [*decoder, "hardware.devices=2", "parallel=fsdp"]
    assert runs["data", "full"].data.metrics[gather] == fp32_prediction(*fsdp)[f"pred/{gather}"] / 2
    tp_sp = [*decoder, "hardware.devices=2", "parallel=tp_sp"]
    assert runs["tensor", "none"].data.metrics[sp] == fp32_prediction(*tp_sp)[f"pred/{sp}"] / 2
    # gradients reduced in 16 bits (trainer.grad_reduce=bf16): half the reduce-scatter's bytes
    scatter, cp = (
        COMM_BYTES_BY_COLLECTIVE.at(collective="reduce_scatter"),
        [*decoder, "hardware.devices=2", "parallel=cp", "parallel.shard=full"],
    )
    assert (
        runs["context", "full"].data.metrics[scatter]
        == fp32_prediction(*cp, TRUE)[f"pred/{scatter}"] / 2
    )
    # the stages' sends halve; the tied embedding's gradient, summed between the ends, stays fp32
    pp, pipeline = (
        COMM_BYTES_PER_STEP.at(dim="pp"),
        [*decoder, "hardware.devices=2", "parallel=pipeline"],
    )
    tied, _ = tied_share(job_of(*pipeline))
    sent = fp32_prediction(*pipeline)[f"pred/{pp}"] - tied
    assert tied > 0 and runs["pipeline", "none"].data.metrics[pp] == sent / 2 + tied
    # gathered right after the step: every all-gather of a step (but the first's) follows its
    # optimizer's span, each unit's bf16 weights once, as gathering behind the next forward does
    after = runs["data", "optimizer"]
    zero2 = [*decoder, "hardware.devices=2", "parallel=data", "parallel.shard=gradients"]
    assert after.data.metrics[gather] == fp32_prediction(*zero2)[f"pred/{gather}"] / 2
    client = MlflowClient(store)
    trace = client.download_artifacts(after.info.run_id, "timeline.trace.json", str(tmp_path))
    spans = sorted(
        (e for e in json.loads(Path(trace).read_text())["traceEvents"]
         if e.get("ph") == "X" and e["tid"] == 0),
        key=lambda e: e["ts"],
    )  # fmt: skip
    names = [e["name"] for e in spans]
    steps = [i for i, n in enumerate(names) if n == "forward"]
    for start, end in zip(steps[1:], [*steps[2:], len(names)], strict=True):
        step = names[start:end]
        assert "dp all-gather" in step and "dp all-gather" not in step[: step.index("optimizer")]


@pytest.mark.slow
def test_bf16_true_under_expert_parallelism_equals_one_process_in_bf16_true(
    store: str, tmp_path: Path, cli: Cli
) -> None:
    """dp 4 x ep 2 over 16-bit weights: FSDP2 shards each block's experts over the 2 ranks that
    hold the same ones and the rest over all 4 (torchtitan's way). The experts' gradients are
    summed over their 2 and divided by 4, as the mean divides the rest: one process's losses,
    every byte as planned. Capacity 2 = n_experts / top_k: no token dropped, no padding."""
    job = ["model=moe", "model.d_model=32", "model.n_layers=2", "model.dropout=0",
           "model.capacity_factor=2", "model.context_len=32", *COMMON]  # fmt: skip
    single = loss_series(store, train(*job, TRUE))
    layout = ["parallel=ep", "parallel.dp=4", "parallel.shard=optimizer"]
    done = cli(*job, *QUICK, TRUE, *layout, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    (run,) = [r for r in all_runs(store) if r.data.tags.get("world_size") == "4"]
    assert losses_by_step(store, run.info.run_id) == pytest.approx(single, rel=BF16_RELATIVE)
    m = run.data.metrics
    moved = {k for k in m if k.startswith("comm_bytes_per_step/")}
    assert {COMM_BYTES_PER_STEP.at(dim="dp"), COMM_BYTES_PER_STEP.at(dim="ep")} <= moved
    assert all(m[k] == m[f"pred/{k}"] for k in moved)


@pytest.mark.slow
def test_fp8_sharded_equals_one_process_in_fp8_and_moves_bf16_true_bytes(
    store: str, tmp_path: Path, cli: Cli
) -> None:
    """torchao's float8 layers over bf16-true: their products changed the arithmetic, the
    layout did not (beyond the bound of bf16's roundings: tensorwise scales come from each
    rank's own part of the batch, and a 16-bit rounding apart may round to another float8
    value; measured 2.4e-4 at most), and FSDP gathers the same bf16 weights as bf16-true's."""
    fp8, decoder = "trainer.precision=fp8", [*DECODER, *COMMON]
    single = loss_series(store, train(*decoder, fp8))
    assert single != loss_series(store, train(*decoder, TRUE))
    done = cli(*decoder, "hardware.devices=2", "parallel=fsdp", *QUICK, fp8, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    (run,) = [r for r in all_runs(store) if r.data.tags.get("world_size") == "2"]
    assert losses_by_step(store, run.info.run_id) == pytest.approx(single, rel=BF16_RELATIVE)
    m = run.data.metrics
    true = fp32_prediction(*decoder, "hardware.devices=2", "parallel=fsdp", TRUE)
    moved = {k for k in m if k.startswith("comm_bytes_per_step/")}
    assert moved and all(m[k] == m[f"pred/{k}"] == true[f"pred/{k}"] for k in moved)


@pytest.mark.slow
def test_an_ffnn_pipeline_in_bf16_sends_16_bit_activations(
    store: str, tmp_path: Path, cli: Cli
) -> None:
    job = [*FFNN, *COMMON, "parallel=pp_tp"]
    single = loss_series(store, train(*FFNN, *COMMON, BF16))
    done = cli(*job, *QUICK, BF16, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    (run,) = [r for r in all_runs(store) if r.data.tags.get("world_size") == "4"]
    assert losses_by_step(store, run.info.run_id) == pytest.approx(single, rel=BF16_RELATIVE)
    m, full = run.data.metrics, fp32_prediction(*job)
    for dim in ("pp", "tp"):  # the FFNN's layers hand each other autocast's 16-bit outputs
        key = f"comm_bytes_per_step/{dim}"
        assert m[key] == m[f"pred/{key}"] == full[f"pred/{key}"] / 2


@pytest.mark.slow
def test_compiling_changes_no_loss(store: str) -> None:
    from torch._dynamo.utils import counters

    job = ["model=ffnn", "data=digits", *COMMON]
    eager = loss_series(store, train(*job))
    counters.clear()
    compiled = loss_series(store, train(*job, "trainer.compile=true"))
    assert counters["stats"]["unique_graphs"] > 0  # the model's forward ran as a graph
    assert compiled == pytest.approx(eager, rel=1e-5)


PEAK_OF_A_BLOCK = """
import torch
from torch import nn
from runner.training.callbacks.memory import GIB, PeakMemory
model = nn.Linear(1024, 1024)  # 4 MiB of weights
memory = PeakMemory(cuda=False)
memory.start(model)
block = torch.ones(64 * 2**20 // 4)  # 64 MiB written: resident
del block
print(memory.peak_gib() * GIB, sum(p.numel() * 4 for p in model.parameters()))
"""


@pytest.mark.slow
def test_peak_memory_counts_the_weights_and_what_training_adds() -> None:
    """On a CPU: the parameters held at the start, and the resident peak grown since. In a
    process of its own: in this one, memory that earlier tests freed and malloc kept resident
    (runner/launcher/allocator.py) would take the block without growing the peak."""
    done = subprocess.run([sys.executable, "-c", PEAK_OF_A_BLOCK], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    peak, weights = map(float, done.stdout.split())
    # Net growth: what the process releases meanwhile (seen: 320 KiB) counts against the block.
    assert weights + 63 * 2**20 <= peak < weights + 80 * 2**20


@pytest.mark.slow
def test_every_run_logs_peak_memory_and_mfu_beside_the_planners(store: str) -> None:
    job = ["model=decoder", "trainer.max_steps=8", "trainer.val_batches=0"]
    run_id = train(*job)
    (run,) = [r for r in all_runs(store) if r.info.run_id == run_id]
    m = run.data.metrics
    assert m[PEAK_MEMORY.name] == m["rank_0/peak_memory_gib"] > 0
    assert m[PEAK_ALLOCATED.name] == m["rank_0/peak_allocated_gib"]
    planned = memory_per_device_gib(job_of(*job))
    # At least the weights, gradients and Adam state the planner counts (16 bytes a parameter),
    # held at once. Malloc's bytes in use, not resident memory: this process has run other jobs,
    # and what they freed, kept resident, takes this one's without growing it (the resident
    # figure is checked in processes of their own: above, and tests/test_recompute.py). The math
    # library's workspace predates the run in this process too.
    resident = planned["total"] - planned["activations"] - planned["workspace"]
    assert m[PEAK_ALLOCATED.name] > resident
    assert m[prediction(PEAK_MEMORY.name)] == pytest.approx(planned["total"])
    # Both MFUs divide the same model FLOPs by a step time and the same peak.
    assert m[MFU.name] * m[STEP_TIME.name] == pytest.approx(
        m[prediction(MFU.name)] * m[prediction(STEP_TIME.name)]
    )


# --- 16-bit weights over fp32 masters (bf16-true) and fp8, as the planner prices them ---

GIB = 2**30
H100_DP8 = ["mode=plan", "hardware=h100", "hardware.devices=8", "parallel.dp=8"]


def parts(*overrides: str) -> tuple[dict[str, float], int]:
    job = job_of(*overrides)
    return memory_per_device_gib(job), params_per_device(job)


@pytest.mark.parametrize(("reduce", "grad"), [("fp32", 4), ("bf16", 2)])
def test_zero_1_over_16_bit_weights_holds_2_bytes_whole_and_the_rest_split(
    reduce: str, grad: int
) -> None:
    """FSDP2 without resharding after forward (ZeRO-1 and ZeRO-2 alike):
    2 bytes of weights gathered whole; fp32 masters (4), AdamW's moments (8) and the gradients
    (their reduced width) split n ways, beside one unit's whole gradient as backward makes it
    (2 bytes) and as the reduce-scatter takes it (the reduced width). Megatron's distributed
    optimizer keeps the gradients whole: 6 + 12/n."""
    zero_1 = [*H100_DP8, "trainer.precision=bf16-true", f"trainer.grad_reduce={reduce}"]
    mem, params = parts(*zero_1, "parallel.shard=optimizer")
    unit = largest_unit(job_of(*zero_1, "parallel.shard=optimizer"))
    assert mem["weights"] == pytest.approx(params * 2 / GIB)
    assert mem["master_weights"] == pytest.approx(params * 4 / 8 / GIB)
    assert mem["optimizer_state"] == pytest.approx(params * 8 / 8 / GIB)
    assert mem["gradients"] == pytest.approx((params * grad / 8 + unit * (2 + grad)) / GIB)
    assert mem["weight_copies"] == 0
    assert mem == parts(*zero_1, "parallel.shard=gradients")[0]
    fp32, _ = parts(*H100_DP8, "parallel.shard=optimizer", "trainer.precision=bf16-mixed")
    # autocast over fp32 weights: FSDP's fp32 shards beside the whole weights it gathers
    assert fp32["master_weights"] == 0
    assert fp32["weights"] == pytest.approx(params * 4 * (1 + 1 / 8) / GIB)


def test_zero_3_over_16_bit_weights_gathers_16_bits_and_its_shards_are_the_masters() -> None:
    true = job_of(*H100_DP8, "parallel.shard=full", "trainer.precision=bf16-true")
    mixed = job_of(*H100_DP8, "parallel.shard=full", "trainer.precision=bf16-mixed")
    planned = {j.trainer.precision: predict(j) for j in (true, mixed)}
    gather = prediction(COMM_BYTES_BY_COLLECTIVE.at(collective="all_gather"))
    scatter = prediction(COMM_BYTES_BY_COLLECTIVE.at(collective="reduce_scatter"))
    assert planned["bf16-true"][gather] == planned["bf16-mixed"][gather] / 2
    assert planned["bf16-true"][scatter] == planned["bf16-mixed"][scatter]  # fp32 by default
    mem, params = memory_per_device_gib(true), params_per_device(true)
    assert mem["master_weights"] == pytest.approx(params * 4 / 8 / GIB)


def test_zero_1_moves_one_all_reduces_bytes() -> None:
    """As Megatron's distributed optimizer: a reduce-scatter of the gradients and an all-gather of
    the weights (here before the next forward), each on the wire (n-1)/n of its payload where an
    all-reduce puts 2(n-1)/n: at one width, the payloads of the two add up to twice the
    all-reduce's."""
    common = [*H100_DP8, "trainer.precision=bf16-true", "trainer.grad_reduce=bf16"]
    ddp = predict(job_of(*common))
    zero = predict(job_of(*common, "parallel.shard=optimizer"))
    dp = prediction(COMM_BYTES_PER_STEP.at(dim="dp"))
    assert f"{dp}/all_reduce" not in zero
    moved = zero[f"{dp}/reduce_scatter"] + zero[f"{dp}/all_gather"]
    assert moved == 2 * ddp[dp] and zero[f"{dp}/reduce_scatter"] == zero[f"{dp}/all_gather"]
    # over fp32 weights too: fp32 gathered, fp32 scattered, as DDP all-reduces them
    fp32, ddp32 = (predict(job_of(*H100_DP8, *s)) for s in (["parallel.shard=optimizer"], []))
    assert fp32[f"{dp}/reduce_scatter"] == fp32[f"{dp}/all_gather"] == ddp32[dp]


def test_sequence_parallelism_over_16_bit_weights_moves_16_bits() -> None:
    """Autocast keeps the residual stream and the norms' outputs fp32, which sequence
    parallelism gathers; over 16-bit weights every value it moves is 16-bit: half of 32-true's."""
    tp = ["mode=plan", "hardware=h100", "hardware.devices=2", "parallel=tp_sp", "model.dropout=0"]
    key = prediction(COMM_BYTES_PER_STEP.at(dim="sp"))
    sp = {p: predict(job_of(*tp, f"trainer.precision={p}"))[key]
          for p in ("32-true", "bf16-mixed", "bf16-true")}  # fmt: skip
    assert sp["bf16-true"] == sp["32-true"] / 2 < sp["bf16-mixed"]


def test_fp8_runs_the_blocks_linear_layers_at_the_fp8_rate() -> None:
    """At an fp8 peak equal to bf16's, fp8 plans as bf16-true; at the H100's 1,979 (twice) only
    the blocks' linear layers speed up, so compute falls, by less than half."""
    common = ["mode=plan", "hardware=h100", "model=gpt3_175b", "model.n_layers=4"]

    def compute(*more: str) -> float:
        return plan(job_of(*common, *more))["time_by_part_s"]["compute"]

    bf16, fp8 = compute("trainer.precision=bf16-true"), compute("trainer.precision=fp8")
    assert compute("trainer.precision=fp8", "hardware.peak_tflops.fp8=989") == bf16
    assert bf16 / 2 < fp8 < bf16


@pytest.mark.parametrize(
    ("patch", "said"),
    [
        (
            "torchao",
            "fp8 trains through torchao's float8 layers, which are not installed: "
            "pip install torchao",
        ),
        ("torch", "fp8 on a CPU needs torch >= 2.13 (its CPU float8 products); this is 2.12.1"),
    ],
)
def test_fp8_without_torchao_or_on_an_older_torch_is_refused_in_one_line(
    monkeypatch: pytest.MonkeyPatch, patch: str, said: str
) -> None:
    from runner.config import trainer

    if patch == "torchao":
        monkeypatch.setattr(trainer.importlib.util, "find_spec", lambda name: None)
    else:
        monkeypatch.setattr(trainer.metadata, "version", lambda name: "2.12.1")
    cfg, _ = compose_job("trainer.precision=fp8")
    with pytest.raises(validate_module.ConfigError) as error:
        validate(cfg)
    assert str(error.value) == f"trainer.precision: {said}"
