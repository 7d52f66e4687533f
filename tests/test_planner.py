"""The planner: the seed's sizes and price for GPT-3, memory that says which layouts fit, hardware
profiles that are complete, and the report that compares predictions with measurements."""

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from statistics import median
from types import SimpleNamespace

import pytest
from matplotlib.image import imread
from mlflow import MlflowClient
from omegaconf import OmegaConf

from runner import validate
from runner.job import resolve_job
from runner.metrics import (
    COMM_BYTES_PER_STEP,
    COMM_TIME,
    COST,
    ENERGY,
    MFU,
    PEAK_MEMORY,
    PLAN_FITS,
    PLAN_HOURS,
    PLAN_PARAMS,
    PLAN_TOKENS_PER_S,
    STEP_TIME,
    prediction,
)
from runner.planner import plan
from runner.planner.hardware import flops_per_device
from tests.helpers.in_process import Cli
from tests.helpers.jobs import compose_job
from tests.helpers.jobs import planned as planned_job
from tests.helpers.metrics import assert_registered
from tests.helpers.records import all_runs

# The seed's cluster: 50,000 GPUs at 350 W, PUE 1, $0.10/kWh, for 60 days.
SEED_PRICE = [
    "mode=plan", "model=gpt3_175b", "hardware=h100_cluster", "hardware.nodes=6250",
    "hardware.power_w=350", "hardware.pue=1", "hardware.usd_per_kwh=0.10", "plan.hours=1440",
    "parallel.tp=8", "parallel.pp=10", "parallel.dp=null", "data.batch_size=2500",
    "parallel.schedule=gpipe", "parallel.microbatches=4",
]  # fmt: skip


def test_gpt3_on_the_seeds_cluster_costs_the_seeds_price(
    tmp_path: Path, cli: Cli, seeded: str
) -> None:
    done = cli(*SEED_PRICE, "plan.json=true", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])  # the last line is the JSON object
    assert out["world_size"] == 50_000
    assert out[ENERGY.name] == pytest.approx(25_200_000)  # 17.5 MW for 1,440 h
    assert out[COST.name] == pytest.approx(2_520_000)
    parts = out["params_by_component"]  # counted from the config (the formulas are tested)
    assert parts["embedding"] == 50_000 * 12_288  # 614.4 M
    assert parts["attention"] / 96 == pytest.approx(604e6, rel=1e-3)
    assert parts["ffn"] / 96 == pytest.approx(1_208e6, rel=1e-3)
    assert out[PLAN_PARAMS.name] == pytest.approx(175e9, rel=0.01)
    for key in ("weights", "gradients", "optimizer_state", "activations"):
        assert out["mem_per_device_gib"][key] > 0
    assert set(out["comm_bytes_per_step"]) == {"dp", "tp", "pp"}
    assert 0 < out[MFU.name] < 1 and out[STEP_TIME.name] > 0 and out[PLAN_TOKENS_PER_S.name] > 0
    (run,) = all_runs(seeded)
    assert (run.info.status, run.data.tags["mode"]) == ("FINISHED", "plan")
    assert run.data.metrics[COST.name] == pytest.approx(2_520_000)
    assert_registered(run)


MEGATRON = ["parallel.tp=8", "parallel.pp=16", "parallel.dp=1", "parallel.microbatches=16"]


def planned(*overrides: str) -> dict:
    cfg, _ = compose_job("mode=plan", "model=gpt3_175b", "hardware=h100_cluster", *overrides)
    validate.validate(cfg)
    job = resolve_job(cfg)
    return plan(job) | {"memory": cfg.hardware.memory_gib}


def test_a_plan_answers_where_training_refuses(
    tmp_path: Path,
    cli: Callable[..., subprocess.CompletedProcess],
    seeded: str,
) -> None:
    # The cluster's 128 devices are all replicas: the default batch of 32 does not split into
    # them. Planned at 128, said on one line; GPT-3 whole on a device is a plan that does not fit.
    done = cli(
        "mode=plan", "model=gpt3_175b", "hardware=h100_cluster", "plan.json=true", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.startswith(
        "note: data.batch_size 32 does not split into 128 data-parallel replicas x 1 micro-batches:"
        " planned at 128\n"
    )
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["world_size"] == 128 and out[PLAN_FITS.name] is False and out["bound"] == "memory"
    assert out["to_fit"].startswith(f"{out['mem_per_device_gib']['total'] / 80:,.1f} x a device's")
    (run,) = all_runs(seeded)
    assert (run.data.tags[PLAN_FITS.name], run.data.params["data.batch_size"]) == ("no", "128")
    # On this host's profile not one layer fits 24 GiB without a tensor-parallel split.
    done = cli("mode=plan", "model=gpt3_175b", "hardware.memory_gib=24", cwd=tmp_path)
    assert done.returncode == 0 and "one layer alone needs 27 GiB at parallel.tp=1" in done.stdout


def test_the_plan_says_which_layouts_fit() -> None:
    # 175 B parameters with AdamW: 16 bytes each, 2.8 TB, on one 80 GB device each: no.
    whole = planned("parallel=data", "data.batch_size=128")
    assert whole["mem_per_device_gib"]["total"] > whole["memory"]
    # Megatron's GPT-3 layout: 8-way tensor, 16-way pipeline, bf16, activations recomputed: yes.
    split = planned(*MEGATRON, "trainer.precision=bf16-mixed", "trainer.recompute=full")
    assert split["mem_per_device_gib"]["total"] < split["memory"]
    # Without recomputation the first stage holds p micro-batches of L/p layers: all L layers'.
    # In fp32, more than the device; at 16 bits the runner's blocks fit, where Megatron's would
    # not: its GeLU keeps 10 + 24/t values a layer, the runner's ReLU 9 + 16/t
    # (tests/test_sequence.py), about two thirds at tp 8.
    bf16 = planned(*MEGATRON, "trainer.precision=bf16-mixed")
    assert planned(*MEGATRON)["mem_per_device_gib"]["total"] > split["memory"]
    held = bf16["mem_per_device_gib"]["activations"]
    assert held > 2.5 * split["mem_per_device_gib"]["activations"]
    megatron = held * (10 + 24 / 8) / (9 + 16 / 8)
    assert bf16["mem_per_device_gib"]["total"] < split["memory"]
    assert bf16["mem_per_device_gib"]["total"] - held + megatron > split["memory"]
    share = 174.6e9 * 4 / 2**30 / 128  # fp32 weights, 1/128 each, plus the embedding on the ends
    assert share < split["mem_per_device_gib"]["weights"] < share + 614.4e6 * 4 / 2**30


def test_mixed_precision_keeps_fp32_state_and_halves_activations() -> None:
    # Lightning's autocast: fp32 weights, gradients and Adam moments, a 16-bit copy of each
    # weight, activations at 16 bits; matmuls at the bf16 peak.
    fp32, bf16 = planned(*MEGATRON), planned(*MEGATRON, "trainer.precision=bf16-mixed")
    mem32, mem16 = fp32["mem_per_device_gib"], bf16["mem_per_device_gib"]
    for key in ("weights", "gradients", "optimizer_state"):
        assert mem16[key] == pytest.approx(mem32[key])
    assert mem16["weight_copies"] == pytest.approx(mem32["weights"] / 2)
    assert mem32["weight_copies"] == 0
    # Half the layers' activations on the busiest rank, the first stage's (the fp32 logits sit on
    # the last stage's rank, which holds fewer micro-batches); without dropout, whose masks are a
    # byte at any precision on a GPU
    dry = ["model.dropout=0", "trainer.precision=bf16-mixed"]
    assert planned(*MEGATRON, *dry)["mem_per_device_gib"]["activations"] == pytest.approx(
        planned(*MEGATRON, "model.dropout=0")["mem_per_device_gib"]["activations"] / 2
    )
    assert mem16["activations"] > mem32["activations"] / 2  # the masks stay a byte
    # The same model FLOPs against each precision's peak (989 and 67 TFLOP/s on an H100).
    assert bf16[STEP_TIME.name] < fp32[STEP_TIME.name]
    flops = [run[MFU.name] * run[STEP_TIME.name] * peak for run, peak in ((fp32, 67), (bf16, 989))]
    assert flops[0] == pytest.approx(flops[1])
    # The residual stream stays fp32 between stages; the blocks' tp forward all-reduces are
    # 16-bit and their backward ones fp32 (the gradients of the stream): 3/4 of the bytes. The
    # vocabulary's (split over the tp ranks) are fp32 at every precision.
    moved32, moved16 = fp32["comm_bytes_per_step"], bf16["comm_bytes_per_step"]
    blocks = planned(*MEGATRON, "parallel.vocab_parallel=false")["comm_bytes_per_step"]["tp"]
    vocab = moved32["tp"] - blocks
    assert 0 < vocab < blocks
    assert moved16["pp"] == moved32["pp"] and moved16["tp"] == blocks * 3 / 4 + vocab


def test_a_token_budget_sets_the_duration() -> None:
    out = planned(*MEGATRON, "plan.tokens=3e11")  # GPT-3's 300 B tokens
    assert out[PLAN_HOURS.name] == pytest.approx(3e11 / out[PLAN_TOKENS_PER_S.name] / 3600)


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["hardware.power_w=-350"], "hardware.power_w"),
        (["hardware.intra_node.efficiency=1.5"], "hardware.intra_node.efficiency"),
        (["hardware.tiers.tp=nvlink"], "hardware.tiers.tp"),
        (["mode=plan", "hardware=dgx_h100", "parallel.dp=1", "parallel.tp=3"], "parallel"),
        (["mode=plan", "hardware=dgx_h100", "parallel=data", "parallel.tp=3"], "hardware.devices"),
        (["mode=plan", "trainer.precision=fp4"], "trainer.precision"),
        (["mode=plan", "hardware=a100", "trainer.precision=fp8"], "hardware.peak_tflops"),
        (["mode=plan", "trainer.precision=16-mixed"], "trainer.precision"),  # fp16 on a CPU
        (["mode=plan", "trainer.tf32=true"], "trainer.tf32"),  # a CPU has no TF32
        (["mode=plan", "hardware=h100", "parallel=tensor", "hardware.devices=2",
          "trainer.precision=16-mixed"], "trainer.precision"),  # loss scaling over DTensor
        (["mode=plan", "parallel=pipeline", "hardware.devices=2", "trainer.compile=true"],
         "trainer.compile"),
        (["mode=plan", "hardware=h100", "trainer.precision=bf16-mixed",
          "~hardware.peak_tflops.bf16"], "hardware.peak_tflops"),
        (["mode=calibrate", "parallel=data", "hardware.devices=2"], "mode"),  # one process only
    ],
)  # fmt: skip
def test_bad_profiles_and_plans_name_the_key(overrides: list[str], key: str) -> None:
    cfg, _ = compose_job(*overrides)
    with pytest.raises(validate.ConfigError) as error:
        validate.validate(cfg)
    assert error.value.key == key


def test_a_profile_missing_a_field_names_it() -> None:
    cfg, _ = compose_job("mode=plan", "hardware=h100")
    cfg.hardware.power_w = "???"
    with pytest.raises(validate.ConfigError) as error:
        validate.validate(cfg)
    assert error.value.key == "hardware.power_w"


def test_every_shipped_profile_is_complete() -> None:
    for profile in ("cpu", "h100", "h200", "a100", "dgx_h100", "dgx_a100", "h100_cluster"):
        cfg, _ = compose_job(
            "mode=plan", f"hardware={profile}", "parallel=data", "data.batch_size=128"
        )
        validate.validate(cfg)
        assert not OmegaConf.missing_keys(cfg.hardware), profile


def rank_correlation(xs: list[float], ys: list[float]) -> float:
    """Spearman's rho of values without ties: 1 - 6 sum(d^2) / (n (n^2 - 1))."""
    ranks = [[sorted(v).index(x) for x in v] for v in (xs, ys)]
    d2 = sum((a - b) ** 2 for a, b in zip(*ranks, strict=True))
    return 1 - 6 * d2 / (len(xs) * (len(xs) ** 2 - 1))


def expected(metrics: list[dict[str, float]], figure: str, predicted: str) -> tuple[float, float]:
    """Median |relative error| and rank correlation over the runs that have both figures."""
    both = [(m[figure], m[predicted]) for m in metrics if figure in m]
    meas, pred = [m for m, _ in both], [p for _, p in both]
    return median(abs(p / m - 1) for m, p in both), rank_correlation(pred, meas)


def test_the_report_compares_a_sweeps_predictions_with_its_measurements(
    store: str, tmp_path: Path
) -> None:
    from runner.app import run_job

    client = MlflowClient(store)
    exp = client.create_experiment("runner")
    sweep = client.create_run(exp, tags={"mode": "sweep"}).info.run_id
    # Predictions off by +10 %, -20 %, +40 %, -25 %; step time's ranks 3 and 4 swapped. The first
    # run is older, from before memory and MFU were measured: the memory figures leave it out.
    step = [(1.0, 1.1), (2.0, 1.6), (3.0, 4.2), (4.0, 3.0)]
    memory = [(10.0, 12.0), (20.0, 30.0), (30.0, 27.0)]  # +20 %, +50 %, -10 %; 2 and 3 swapped
    mfu = [(0.4, 0.5), (0.3, 0.33), (0.5, 0.45)]
    logged = [{STEP_TIME.name: m, prediction(STEP_TIME.name): p} for m, p in step]
    for metrics, (mem, pred_mem), (util, pred_util) in zip(logged[1:], memory, mfu, strict=True):
        metrics.update({PEAK_MEMORY.name: mem, prediction(PEAK_MEMORY.name): pred_mem})
        metrics.update({MFU.name: util, prediction(MFU.name): pred_util})
    for metrics in logged:
        run = client.create_run(exp, tags={"mode": "train", "mlflow.parentRunId": sweep})
        for key, value in metrics.items():
            client.log_metric(run.info.run_id, key, value)
        client.set_terminated(run.info.run_id)
    # A newer sweep of plans (README's order): nothing to compare, so the report passes it over.
    plans = client.create_run(exp, tags={"mode": "sweep"}).info.run_id
    plan = client.create_run(exp, tags={"mode": "plan", "mlflow.parentRunId": plans})
    client.set_terminated(plan.info.run_id)
    cfg, choices = compose_job("mode=report", f"report.sweep={plans}")
    with pytest.raises(validate.ConfigError, match="holds plan runs, not training runs"):
        run_job(cfg, choices, ["mode=report"])
    cfg, choices = compose_job("mode=report")
    result = run_job(cfg, choices, ["mode=report"])
    for figure in (STEP_TIME.name, PEAK_MEMORY.name):
        error, rank = expected(logged, figure, f"pred/{figure}")
        assert result[f"median_abs_error/{figure}"] == pytest.approx(error)
        assert result[f"spearman/{figure}"] == pytest.approx(rank)
    assert result["median_abs_error/mfu"] == pytest.approx(
        expected(logged, MFU.name, prediction(MFU.name))[0]
    )
    ranks = (result["spearman/step_time_s"], result["spearman/peak_memory_gib"])
    assert ranks == pytest.approx((0.8, 0.5))  # 1 - 6 * 2 / (4 * 15), 1 - 6 * 2 / (3 * 8)
    (report,) = [r for r in all_runs(store) if r.data.tags.get("mode") == "report"]
    assert report.data.tags["report.sweep"] == sweep
    assert report.data.metrics["spearman/peak_memory_gib"] == pytest.approx(0.5)
    assert_registered(report)
    artifacts = {a.path for a in client.list_artifacts(report.info.run_id)}
    assert {"report.txt", "predicted_vs_measured.png"} <= artifacts
    said = client.download_artifacts(report.info.run_id, "report.txt", tmp_path)
    assert Path(said).read_text().startswith(f"report of sweep {sweep} (")  # which one it took
    png = client.download_artifacts(report.info.run_id, "predicted_vs_measured.png", tmp_path)
    height, width, _ = imread(png).shape
    assert width > 2 * height  # two panels side by side: step time and peak memory


def fake_run(name: str, **metrics: float) -> SimpleNamespace:
    data = SimpleNamespace(metrics=metrics, tags={"parallel": name})
    return SimpleNamespace(data=data, info=SimpleNamespace(run_name=name))


def test_the_report_leaves_a_run_without_memory_out_of_the_memory_figures() -> None:
    from runner.modes import report

    step = {STEP_TIME.name: 2.0, prediction(STEP_TIME.name): 2.5}
    old = fake_run("old", **step)
    new = fake_run("new", **step, peak_memory_gib=4.0, **{prediction(PEAK_MEMORY.name): 3.0})
    result = report.summary([old, new])
    assert result["median_abs_error/peak_memory_gib"] == pytest.approx(0.25)
    assert "spearman/peak_memory_gib" not in result  # one run has it: nothing to rank
    assert "spearman/step_time_s" not in result  # the two step times are the same: no ranks
    lines = report.table([old, new], result).splitlines()
    assert "peak GiB measured" in lines[0]
    assert lines[1].split() == ["old", "2.0000", "2.5000", "+25.0%", "-", "-", "-"]
    assert lines[2].split() == ["new", "2.0000", "2.5000", "+25.0%", "4.0000", "3.0000", "-25.0%"]
    assert len(report.picture([old, new], result).axes) == 2
    # Names whole: a sweep's runs differ at their ends.
    long = [fake_run(f"decoder pipeline hardware.devices=2 parallel.microbatches={m}", **step)
            for m in (2, 4)]  # fmt: skip
    names = [line.split("  ")[0] for line in report.table(long, result).splitlines()[1:3]]
    assert names == [r.info.run_name for r in long]
    # A measurement at or below 0 (a tiny run's resident memory read below its start) is no
    # figure: left out of the errors and of the log-log picture, which it would break.
    below = fake_run("below", **step, peak_memory_gib=-4e-5, **{prediction(PEAK_MEMORY.name): 1e-4})
    with_below = report.summary([old, new, below])
    assert with_below["median_abs_error/peak_memory_gib"] == pytest.approx(0.25)
    assert len(report.picture([old, new, below], with_below).axes) == 2
    # No run with memory (a sweep from before it was measured): step time only, as it was.
    result = report.summary(
        [old, fake_run("older", step_time_s=1.0, **{prediction(STEP_TIME.name): 1.2})]
    )
    assert not any(PEAK_MEMORY.name in key for key in result)
    assert "peak GiB" not in report.table([old], result)
    assert len(report.picture([old], result).axes) == 1


def test_the_snapshot_interval_minimises_the_expected_waste() -> None:
    from runner.planner.failures import snapshot_interval_s, waste_fraction

    write_s, mtbf_s = 60.0, 3.1 * 3600  # Llama 3's cluster: one interruption every ~3.1 h
    best = snapshot_interval_s(write_s, mtbf_s)
    scan = min(range(60, 6 * 3600), key=lambda t: waste_fraction(t, write_s, mtbf_s))
    assert best == pytest.approx(scan, abs=1)  # Young's closed form against a brute-force scan
    out = planned(*MEGATRON, "plan.snapshot_write_s=60")["snapshots"]
    assert out["job_mtbf_hours"] == pytest.approx(50_000 / 128)
    assert 0 < out["expected_waste_fraction"] < 1


def test_without_a_pipeline_virtual_stages_change_no_prediction() -> None:
    from runner.models.registry import spec_for
    from runner.planner import predict

    cfg, _ = compose_job("parallel=data", "hardware.devices=2", "parallel.virtual_stages=2")
    validate.validate(cfg)
    assert predict(resolve_job(cfg))[prediction(COMM_BYTES_PER_STEP.at(dim="dp"))] == 4 * spec_for(
        cfg.model
    ).params(cfg.model)


def test_training_fits_as_the_layout_splits_the_model() -> None:
    """On a CPU the processes share the host: 4 replicas need 4 copies, 4 stages one."""
    big = ["model.d_model=1024", "model.n_heads=8", "model.n_layers=8", "hardware.memory_gib=4"]
    cfg, _ = compose_job(*big)
    validate.validate(cfg)  # one copy: about 1.6 GiB with Adam state and activations
    cfg, _ = compose_job(*big, "parallel=data", "hardware.devices=4", "data.batch_size=32")
    with pytest.raises(validate.ConfigError) as error:
        validate.validate(cfg)
    assert error.value.key == "model" and "x 4 processes on one host" in str(error.value)
    cfg, _ = compose_job(*big, "parallel=pipeline", "hardware.devices=4")
    validate.validate(cfg)


def built_tensors(model_cfg) -> list:
    """The parameters of the module really built (on the meta device: GPT-3 never fills memory)."""
    import torch
    from hydra.utils import instantiate

    with torch.device("meta"):
        return list(instantiate(model_cfg, _convert_="all").parameters())


@pytest.mark.parametrize("preset", ["decoder", "gpt3_175b", "ffnn", "neuron"])
def test_the_tensor_sizes_are_the_built_modules(preset: str) -> None:
    from runner.models.registry import spec_for
    from runner.models.sizes import stage_layers

    cfg, _ = compose_job(f"model={preset}")
    (layers,) = stage_layers(cfg.model, cfg.parallel)
    sizes = spec_for(cfg.model).stage_tensors(cfg.model, layers, True, 1)
    assert sizes == [p.numel() for p in built_tensors(cfg.model)]


@pytest.mark.parametrize(
    ("preset", "cap_mb"),
    [("decoder", None), ("decoder", 2), ("gpt3_175b", None), ("ffnn", None), ("ffnn", 0.01)],
)
def test_all_reduce_calls_are_ddps_buckets(preset: str, cap_mb: float | None) -> None:
    """Counted as DDP counts them (torch's own assignment, its default and set limits), not as
    payload / cap: buckets close at tensor boundaries, and GPT-3's matrices are one each."""
    import torch.distributed as dist
    from torch.nn.parallel.distributed import _BucketCapacityConfig

    from runner.layouts.data.traffic import bucket_count

    cfg, _ = compose_job(f"model={preset}")
    tensors = built_tensors(cfg.model)
    limits = _BucketCapacityConfig.create(cap_mb, None, False)
    ddp, _ = dist._compute_bucket_assignment_by_size(
        list(reversed(tensors)),  # about the order backward makes the gradients
        [limits.first_bucket_bytes_cap, limits.bucket_bytes_cap],
        [False] * len(tensors),
    )
    assert bucket_count([4 * p.numel() for p in tensors], cap_mb) == len(ddp)
    if preset == "gpt3_175b":  # payload / 25 MiB would say ~27,000
        assert len(ddp) < 1_000


def test_a_cpu_rank_computes_at_its_threads_share_of_the_host() -> None:
    # The CPU profile's peak is the whole host's. On 2 cores: one process with both cores reaches
    # all of it, one with one thread half, two processes of one thread each half each; four
    # processes of one thread share the 2 cores: a quarter each, whatever their threads say.
    def rate(devices: int, threads: str) -> float:
        cfg, _ = compose_job(f"hardware.devices={devices}", "hardware.cores=2",
                             f"hardware.threads_per_rank={threads}")  # fmt: skip
        return flops_per_device(cfg.hardware, "fp32")

    host = rate(1, "null")
    assert rate(1, "1") == pytest.approx(host / 2)
    assert rate(2, "1") == pytest.approx(host / 2)
    assert rate(2, "null") == pytest.approx(host / 2)
    assert rate(4, "1") == pytest.approx(host / 4)


def test_ddp_pays_its_cost_whole_and_over_busy_loopback_hides_nothing() -> None:
    job = ["parallel=data", "hardware.devices=2", "data.batch_size=64", "hardware.cores=2"]

    def dp(*more: str) -> tuple[float, float, float]:
        p = planned_job(*job, *more)
        return p[COMM_TIME.name]["dp"], p["comm_hidden_s"]["dp"], p["comm_bytes_per_step"]["dp"]

    link = compose_job(*job)[0].hardware.intra_node
    bare, hidden, grads = dp("hardware.ddp_overhead_us_per_mb=0")
    # Two one-thread ranks fill the 2 cores: the all-reduce is their own copying, none of it
    # hidden: each of DDP's 2 buckets (1 MiB, then the rest) its latency, the bytes at the rate
    assert grads > 2**20
    assert hidden == 0
    assert bare == pytest.approx(2 * link.latency_us * 1e-6 + grads / (link.bandwidth_gbs * 1e9))
    # DDP's own cost: its rate times the gradients' MB, on top
    costly, _, _ = dp("hardware.ddp_overhead_us_per_mb=1000")
    assert costly - bare == pytest.approx(grads / 1e6 * 1000e-6)
    # A spare core each (one thread a rank on 4 cores): backward hides all but the last bucket
    spare, hidden, _ = dp(
        "hardware.ddp_overhead_us_per_mb=0", "hardware.cores=4", "hardware.threads_per_rank=1"
    )
    assert hidden > 0 and spare + hidden == pytest.approx(bare)
