"""mode=calibrate: measure this host, or its GPU, and write a hardware profile later runs can use.

Measured: matmul FLOP/s at each precision the device has (the best of a few sizes), and the share
of it square products of each size reach (the planner's GEMM curve, runner/planner/gemm.py); a
large copy's memory bandwidth; the runner's own training steps of the configured model at
trainer.precision, each followed by the same step in a plain PyTorch loop (paired_step.py): the
plain step's time, which the planner's matrix products at those speeds take a share of
(compute_efficiency), and what the runner's step (Lightning, hooks, logging) adds to it. On a
CPU all this runs at the threads each rank gets (hardware.threads_per_rank; all cores if unset);
there also DTensor's cost per tensor-parallel layer, and gloo's all-reduce and point-to-point time
between two processes over 127.0.0.1 for messages from 4 kB to 16 MB, fitted as latency + size /
bandwidth, and what DDP adds to the configured model's step beyond its all-reduce as that fit
prices it (per MB of gradients); on a GPU the links are the profile's own (one process, one
device, measures no network). The profile, based on the one the run was given, goes to
./conf/hardware/calibrated.yaml where it runs (hardware=calibrated from there), the measurements
to an MLflow run (tag mode=calibrate).
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from omegaconf import DictConfig, OmegaConf
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from runner.compat.float8 import float8_product
from runner.job import Job
from runner.launcher.allocator import keep_freed_memory
from runner.launcher.cluster import free_port
from runner.launcher.fork_server import start_fork_server
from runner.layouts.data.traffic import bucket_count
from runner.metrics import (
    CALIBRATE_BANDWIDTH,
    CALIBRATE_CORES,
    CALIBRATE_DDP_OVERHEAD,
    CALIBRATE_LATENCY,
    CALIBRATE_MATMUL,
    CALIBRATE_MEMORY_BANDWIDTH,
    CALIBRATE_PLAIN_STEP,
    CALIBRATE_PRODUCTS_SHARE,
    CALIBRATE_STEP_FLOPS,
    CALIBRATE_STEP_OVERHEAD,
    CALIBRATE_STEP_TIME,
    CALIBRATE_THREADS,
    CALIBRATE_TP_OVERHEAD,
    CALIBRATE_WORKSPACE,
    STEP_TIME,
    WORKSPACE,
)
from runner.modes.calibrate.split_step import layer_overhead_s, splits
from runner.planner.host_figures import Calibrated, Host, save
from runner.planner.timing import Rates, model_flops_per_step, products_s
from runner.precision import precision_of

# Where the user works, not in the installed package: ./conf is on Hydra's search path
# (conf/config.yaml), so hardware=calibrated finds it there.
PROFILE = Path("conf") / "hardware" / "calibrated.yaml"
SIZES = [2**k for k in range(12, 25, 2)]  # 4 kB .. 16 MB
REPEATS = 5
CPU = torch.device("cpu")
DDP_EXTRA, GRAD_BYTES = "ddp_extra_s", "grad_bytes"  # what the link processes hand back
LINK_REPEATS = 25  # small messages are noisy: a scheduler hiccup is longer than the message
# Seconds of DDP's cost measured in pairs of steps, and the fewest pairs whose median a burst of
# load over a few of them leaves alone (ddp_cost)
DDP_BUDGET_S, MIN_PAIRS = 4.0, 9
# Seconds of calls to time one product size with: a slow path (bf16 on a CPU without bf16
# instructions ran a 1,024-square product at 0.8 GFLOP/s here) would take 15 s of a calibration.
PRODUCT_BUDGET_S = 1.0


def settle(device: torch.device) -> None:
    """A GPU runs work asynchronously: the host waits for it before reading a clock."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def best_time(
    fn: Callable[[], Any],
    repeats: int = REPEATS,
    device: torch.device = CPU,
    budget_s: float | None = None,
) -> float:
    """The shortest of `repeats` timed calls, after a warm-up (allocation, thread pool, kernel
    selection). With a budget, fewer calls where one takes long, none past the warm-up where it
    alone outlasts the budget: a process's own measurement only, as ranks timing a collective
    together must all call it alike."""
    warm_up = timed(fn, device)
    if budget_s is not None:
        # A call past the budget is its own measure: what a first call adds (allocation, kernel
        # selection) is a sliver of it, and a second would double the size's cost
        if warm_up >= budget_s:
            return warm_up
        repeats = max(1, min(repeats, int(budget_s / max(warm_up, 1e-9))))
    return min(timed(fn, device) for _ in range(repeats))


def timed(fn: Callable[[], Any], device: torch.device) -> float:
    settle(device)
    start = time.perf_counter()
    fn()
    settle(device)
    return time.perf_counter() - start


# The peak_tflops keys a device has, and the torch dtype of each (tf32: fp32 on tensor cores).
DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16}
GPU_DTYPES = DTYPES | {"fp16": torch.float16}
# Square products from the smallest a model here multiplies (an attention head's) to past where
# the device's speed levels off; on a GPU from a few tiles to a large LLM's.
CURVE_SIZES = {"cpu": (32, 64, 128, 256, 512, 1024), "cuda": (256, 512, 1024, 2048, 4096, 8192)}


def keys_of(device: torch.device) -> tuple[str, ...]:
    """The peak_tflops keys to measure: a CPU has no TF32 or fp16 fast path; float8 products
    (trainer.precision=fp8) where torch runs them: a GPU of compute capability 8.9 on (Ada,
    Hopper), a CPU under torch 2.13 on (converted, not native: slower than bf16)."""
    keys = tuple(GPU_DTYPES) if device.type == "cuda" else ("fp32", "bf16")
    return (*keys, "fp8") if takes_float8(device) else keys


def takes_float8(device: torch.device) -> bool:
    if device.type == "cuda":
        return torch.cuda.get_device_capability(device) >= (8, 9)
    return tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 13)


def product(n: int, device: torch.device, key: str) -> Callable[[], Any]:
    """An n x n x n product at one peak_tflops key, as a call."""
    if key == "fp8":
        return float8_product(n, device)
    a, b = (torch.randn(n, n, device=device, dtype=GPU_DTYPES[key]) for _ in range(2))
    return lambda: a @ b


def matmul_flops(device: torch.device, key: str) -> dict[int, float]:
    """FLOP/s of square products of each size at one peak_tflops key."""
    out = {}
    torch.set_float32_matmul_precision("high" if key == "tf32" else "highest")
    for n in CURVE_SIZES[device.type]:
        repeats = max(REPEATS, int(2e8 / n**3))  # small products: enough calls to time
        call = product(n, device, key)
        out[n] = 2 * n**3 / best_time(call, repeats, device, PRODUCT_BUDGET_S)
    torch.set_float32_matmul_precision("highest")
    return out


def peak_and_curve(by_size: dict[int, float]) -> tuple[float, list[list[float]]]:
    """The best product's FLOP/s (the peak), and [n, share of it] for each size. Four significant
    digits, not places: a small product timed once in a stall (a short budget on a busy host) has
    a share below 5e-5, which four places would round to 0, a share no profile may have."""
    peak = max(by_size.values())
    return peak, [[n, float(f"{flops / peak:.4g}")] for n, flops in by_size.items()]


def memory_bandwidth(device: torch.device) -> float:
    """Bytes/s of a large copy, read and written (on a CPU larger than its caches)."""
    n = (256 if device.type == "cpu" else 2048) * 2**20 // 4
    src, dst = torch.ones(n, device=device), torch.empty(n, device=device)
    return 2 * n * 4 / best_time(lambda: dst.copy_(src), device=device)


QUICK = {"max_steps": 12, "warmup_steps": 4, "val_batches": 0, "progress_bar": False}


def runner_step(cfg: DictConfig) -> dict[str, float]:
    """The runner's own training (Lightning and all), a few steps, no record, each step followed
    by the same step in a plain PyTorch loop (paired_step.py): its figures (the mean step time,
    what the rank held beyond its tensors), what the runner adds to the plain step, the plain
    step's time."""
    from runner.modes.calibrate.paired_step import PlainStepBeside  # Lightning: imported late
    from runner.training.rank import train

    quick = OmegaConf.merge(cfg, {"trainer": QUICK})
    beside = PlainStepBeside(quick, QUICK["warmup_steps"], device_of(cfg))
    figures = train(quick, callbacks=[beside])
    overhead, plain = CALIBRATE_STEP_OVERHEAD.name, CALIBRATE_PLAIN_STEP.name
    return figures | {overhead: beside.overhead_s(), plain: beside.plain_s()}


def device_of(cfg: DictConfig) -> torch.device:
    return torch.device("cuda" if cfg.hardware.accelerator == "gpu" else "cpu")


def _links(rank: int, port: int, out: str, config: dict[str, Any]) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    # As the runner's ranks: the cores shared between the two (measured: with torch's default, a
    # thread per core in each, DTensor's cost per layer came out 1.8 to 7.2 ms from run to run).
    torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // 2))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    times: dict[str, list[float]] = {"all_reduce": [], "p2p": []}
    peer = 1 - rank
    for size in SIZES:
        t = torch.zeros(size // 4)

        def ping(t: torch.Tensor = t) -> None:  # a round trip: one message each way
            for send in (rank == 0, rank == 1):
                (dist.send if send else dist.recv)(t, peer)

        times["all_reduce"].append(best_time(lambda t=t: dist.all_reduce(t), LINK_REPEATS))
        times["p2p"].append(best_time(ping, LINK_REPEATS) / 2)
    tp_overhead = tensor_layer_overhead(times["all_reduce"][0])
    ddp_extra, grad_bytes = ddp_cost(OmegaConf.create(config))
    if rank == 0:
        figures = {CALIBRATE_TP_OVERHEAD.name: tp_overhead, DDP_EXTRA: ddp_extra}
        Path(out).write_text(json.dumps(times | figures | {GRAD_BYTES: grad_bytes}))
    dist.destroy_process_group()


def tensor_layer_overhead(allreduce_latency: float) -> float:
    """What a tensor-parallel layer costs beyond compute and collectives: a column/row pair of
    tiny Linear layers split over both ranks, forward and backward, against the same pair whole,
    less its two all-reduces (one forward, one backward), per layer."""
    from torch.distributed.device_mesh import init_device_mesh

    from runner.models.plans import split_linear_pairs

    def pair() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64))

    x = torch.randn(8, 64, requires_grad=True)
    split = split_linear_pairs(pair(), init_device_mesh("cpu", (2,)))
    whole = pair()
    t_split = best_time(lambda: split(x).sum().backward(), LINK_REPEATS)
    t_whole = best_time(lambda: whole(x).sum().backward(), LINK_REPEATS)
    return max(0.0, (t_split - t_whole - 2 * allreduce_latency) / 2)


def ddp_cost(cfg: DictConfig) -> tuple[float, list[int]]:
    """What DDP adds to the configured model's step (one sample a process, so that compute
    weighs least) beyond the same step without it, and each gradient's bytes."""
    from runner import plain_loop

    one = OmegaConf.merge(cfg, {"data": {"batch_size": 1}})
    model, optimizer, loss_fn = plain_loop.build(one)
    x, y = plain_loop.random_batch(one, model)

    def step(module: nn.Module) -> Callable[[], None]:
        return lambda: plain_loop.step(module, optimizer, loss_fn, x, y, one.trainer.precision)

    # The model called bare runs no DDP hook (DDP's reducer expects none outside its forward), so
    # the two steps can alternate on the same parameters.
    plain, ddp = step(model), step(DistributedDataParallel(model))
    grads = [p.numel() * p.element_size() for p in model.parameters() if p.requires_grad]
    # Both ranks must call DDP's step as often: as many pairs as the slower rank's first pair
    # fits in the budget (a 15-layer, 1,024-wide model's 60 MB of gradients: 0.45 s a pair here)
    first = torch.tensor([timed(plain, CPU) + timed(ddp, CPU)], dtype=torch.float64)
    dist.all_reduce(first, op=dist.ReduceOp.MAX)
    pairs = max(MIN_PAIRS, min(LINK_REPEATS, int(DDP_BUDGET_S / first.item())))
    return max(0.0, paired_difference(plain, ddp, pairs)), grads


def paired_difference(first: Callable[[], Any], second: Callable[[], Any], pairs: int) -> float:
    """What `second` takes beyond `first`: the median of their differences over `pairs` calls of
    each, alternated, after a warm-up of each. A burst of another process's load lands in one or
    two pairs and the median passes it by; the difference of two medians taken one after the
    other took it whole (gloo's threads waking late, another test's job beside a calibration:
    DDP's cost read as 0 once, 2,729 us/MB quiet)."""
    timed(first, CPU), timed(second, CPU)
    differences = []
    for _ in range(pairs):
        before = timed(first, CPU)
        differences.append(timed(second, CPU) - before)
    return statistics.median(differences)


def link_times(cfg: DictConfig) -> dict[str, Any]:
    """gloo between two processes on 127.0.0.1, forked by the runner's fork server (its imports
    made once, for these and the split step's ranks); rank 0 hands its times back in a file."""
    start_fork_server()
    port = free_port()
    config = OmegaConf.to_container(cfg, resolve=True)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "links.json"
        mp.start_processes(_links, (port, str(out), config), nprocs=2, start_method="forkserver")
        return json.loads(out.read_text())


def fit_line(sizes: list[int], seconds: list[float]) -> tuple[float, float]:
    """(latency s, bandwidth B/s): the smallest message's time, and the slope between the two
    largest (robust where a least-squares line lets one noisy small message move the latency)."""
    slope = (seconds[-1] - seconds[-2]) / (sizes[-1] - sizes[-2])
    return seconds[0], 1 / max(slope, 1e-15)


def measure(cfg: DictConfig, job: Job, keys: tuple[str, ...] | None = None) -> dict[str, Any]:
    """On a CPU at the threads each rank will get (hardware.threads_per_rank; all cores when
    not set), the host's figures scaled up to its cores: its ranks share them. `keys`: the
    peak_tflops keys to measure (None: every one the device has)."""
    device, cores = device_of(cfg), len(os.sched_getaffinity(0))
    threads = cfg.hardware.threads_per_rank or cores
    torch.set_num_threads(threads)
    if cfg.hardware.keep_freed_memory:  # as every rank will run: the plain step's speed sets
        keep_freed_memory()  # compute_efficiency (measured: 5-8 % faster kept)
    # The links first: their processes wait for the fork server's imports, which must not run
    # beside the timings below.
    links = link_figures(cfg) if device.type == "cpu" else {}
    # The runner's step before any other product runs here: its rank measures what the math
    # library keeps (workspace_gib), which products run before it would have made already
    figures = runner_step(cfg)
    step, plain = figures[STEP_TIME.name], figures[CALIBRATE_PLAIN_STEP.name]
    keys = keys_of(device) if keys is None else keys
    measured = {key: peak_and_curve(matmul_flops(device, key)) for key in keys}
    peaks = {key: peak for key, (peak, _) in measured.items()}
    curves = {key: curve for key, (_, curve) in measured.items()}
    bandwidth = memory_bandwidth(device)
    compute = precision_of(job.trainer).compute
    rates = Rates(peaks[compute], curves[compute], bandwidth, Rates.of(job).elem)
    scale = cores / threads if device.type == "cpu" else 1
    return {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else f"{cores} cores",
        CALIBRATE_THREADS.name: threads,
        CALIBRATE_CORES.name: cores,
        CALIBRATE_MATMUL.group: {key: peak * scale for key, peak in peaks.items()},
        "gemm_efficiency": curves,  # lists: in calibration.json, not logged
        CALIBRATE_MEMORY_BANDWIDTH.name: bandwidth * scale,
        CALIBRATE_WORKSPACE.name: figures.get(WORKSPACE.name, 0.0) * 2**30,
        CALIBRATE_STEP_TIME.name: step,
        # what the runner (Lightning, hooks) adds, step by step
        CALIBRATE_STEP_OVERHEAD.name: figures[CALIBRATE_STEP_OVERHEAD.name],
        CALIBRATE_PLAIN_STEP.name: plain,
        CALIBRATE_STEP_FLOPS.name: model_flops_per_step(job) / plain,
        # the share of the plain step its matrix products take, at the speeds measured above
        CALIBRATE_PRODUCTS_SHARE.name: min(1.0, products_s(job, rates) / plain),
        "compute": compute,  # the peak the step's FLOP/s are a share of
    } | links


def link_figures(cfg: DictConfig) -> dict[str, Any]:
    links = link_times(cfg)
    # A ring all-reduce of S bytes over 2 ranks puts 2(n-1)/n * S = S on the wire.
    ar_latency, ar_bandwidth = fit_line(SIZES, links["all_reduce"])
    p2p_latency, p2p_bandwidth = fit_line(SIZES, links["p2p"])
    overhead, grads = CALIBRATE_TP_OVERHEAD.name, sum(links[GRAD_BYTES])
    # DDP's cost beyond the all-reduce of its gradients as the fit prices it (a call a bucket,
    # as the planner counts them), per MB of them
    priced = bucket_count(links[GRAD_BYTES], None) * ar_latency + grads / ar_bandwidth
    return {
        "all_reduce": fitted(ar_latency, ar_bandwidth),
        "p2p": fitted(p2p_latency, p2p_bandwidth),
        "sizes": SIZES,
        "times": {k: links[k] for k in ("all_reduce", "p2p")},
        overhead: links[overhead],
        "tp_layer_overhead_from": "a tiny Linear pair split over 2 processes",
        CALIBRATE_DDP_OVERHEAD.name: max(0.0, links[DDP_EXTRA] - priced) / (grads / 1e6),
    }


def fitted(latency: float, bandwidth: float) -> dict[str, float]:
    """A link's fit, as its figures are logged (`<link>/latency_s`, ...)."""
    return {CALIBRATE_LATENCY.leaf: latency, CALIBRATE_BANDWIDTH.leaf: bandwidth}


def profile_yaml(m: Mapping[str, Any], base: str) -> str:
    """The profile `base` with what was measured in place of its figures."""
    # Four significant figures: a slow bf16 path (0.00215 TFLOP/s) keeps its precision
    peaks = "\n".join(
        f"  {k}: {float(f'{v / 1e12:.4g}')!r}" for k, v in m[CALIBRATE_MATMUL.group].items()
    )
    curves = "\n".join(f"  {k}: {json.dumps(v)}" for k, v in m["gemm_efficiency"].items())
    threads, fields = m[CALIBRATE_THREADS.name], profile(m)
    return f"""# This host ({m["device"]}), as `python -m runner mode=calibrate` measured it on
# {time.strftime("%Y-%m-%d")}, on the profile {base}, at {threads} thread(s) a rank.
# Use it with hardware=calibrated.
defaults:
  - {base}
  - _self_

peak_tflops:  # the best square product at each precision
{peaks}
gemm_efficiency:  # [n, share of peak] of n x n x n products
{curves}
memory_bandwidth_gbs: {fields["memory_bandwidth_gbs"]:.2f}  # a large copy, read and written
workspace_mib:  # what the runner's rank held between steps beyond its tensors
  {m["compute"]}: {fields["workspace_mib"][m["compute"]]:.2f}
compute_efficiency: {fields["compute_efficiency"]:.4f}  # the plain step's time in matrix products
step_overhead_s: {fields["step_overhead_s"]:.5f}  # the runner's step less a plain PyTorch loop's
""" + (link_yaml(m) if "p2p" in m else "")


def link(m: Mapping[str, Any]) -> dict[str, float]:
    """The loopback link as a profile gives it: the slower of all-reduce and P2P."""
    bandwidth, latency = CALIBRATE_BANDWIDTH.leaf, CALIBRATE_LATENCY.leaf
    return {
        "bandwidth_gbs": min(m["all_reduce"][bandwidth], m["p2p"][bandwidth]) / 1e9,
        "latency_us": max(m["all_reduce"][latency], m["p2p"][latency]) * 1e6,
        "efficiency": 1.0,
    }


def profile(m: Mapping[str, Any]) -> dict[str, Any]:
    """The measured figures, as the planner reads a profile's (a CPU's link included)."""
    out = {
        "peak_tflops": {k: v / 1e12 for k, v in m[CALIBRATE_MATMUL.group].items()},
        "gemm_efficiency": m["gemm_efficiency"],
        "memory_bandwidth_gbs": m[CALIBRATE_MEMORY_BANDWIDTH.name] / 1e9,
        "workspace_mib": {m["compute"]: m[CALIBRATE_WORKSPACE.name] / 2**20},
        "compute_efficiency": m[CALIBRATE_PRODUCTS_SHARE.name],
        "step_overhead_s": m[CALIBRATE_STEP_OVERHEAD.name],
    }
    if "p2p" not in m:
        return out
    ddp = m[CALIBRATE_DDP_OVERHEAD.name] * 1e6
    return out | {
        "cores": m[CALIBRATE_CORES.name],
        "intra_node": link(m),
        "ddp_overhead_us_per_mb": ddp,
    }


def link_yaml(m: Mapping[str, Any]) -> str:
    line, overhead_us = link(m), m[CALIBRATE_TP_OVERHEAD.name] * 1e6
    ddp_us = m[CALIBRATE_DDP_OVERHEAD.name] * 1e6
    return f"""cores: {m[CALIBRATE_CORES.name]}  # its processes share them
tp_layer_overhead_us: {overhead_us:.1f}  # {m["tp_layer_overhead_from"]}
ddp_overhead_us_per_mb: {ddp_us:.1f}  # the model's DDP step at 1 sample, over its link's price
intra_node:
  name: gloo over loopback (measured)
  bandwidth_gbs: {line["bandwidth_gbs"]:.4f}
  latency_us: {line["latency_us"]:.1f}
  efficiency: 1.0  # the bandwidth above is what a collective reached
"""


def run(
    cfg: DictConfig, job: Job | None, choices: Mapping[str, str | None], overrides: list[str]
) -> dict[str, Any]:
    from runner.tracking.job_run import recorded_run
    from runner.tracking.store import flat_metrics

    with recorded_run(cfg, choices, overrides) as record:
        measured = measure_all(cfg, job)
        record.log_metrics(flat_metrics({k: v for k, v in measured.items() if k != "times"}))
        record.client.log_dict(record.run_id, measured, "calibration.json")
        base = choices.get("hardware") or "cpu"
        if base == "calibrated":  # calibrating again from the last calibration: its own base
            base = "cpu" if cfg.hardware.accelerator == "cpu" else "h100"
        PROFILE.parent.mkdir(parents=True, exist_ok=True)
        PROFILE.write_text(profile_yaml(measured, base))
        record.client.log_artifact(record.run_id, str(PROFILE))
    print(PROFILE.read_text())
    print(f"wrote {PROFILE.resolve()}: use it with hardware=calibrated from this folder")
    if cfg.hardware.accelerator == "cpu":  # and keep it for hardware.figures=host
        what = Calibrated(base, choices.get("model") or "model", cfg.trainer.precision, True)
        host = Host.here(cfg.hardware.threads_per_rank)
        save(what.path(host), host, what, figures_of(measured))
        print(f"kept it for hardware.figures=host ({what}): {what.path(host)}")
    return measured


def measure_all(
    cfg: DictConfig, job: Job, keys: tuple[str, ...] | None = None, split: bool = True
) -> dict[str, Any]:
    """measure(), and on a CPU whose model splits over 2 ranks, DTensor's cost per split layer
    measured on the model itself (split_step.py) in place of the tiny pair's (with `split`)."""
    measured = measure(cfg, job, keys)
    if split and "p2p" in measured and splits(job):  # a CPU, and a model that splits over 2
        measured[CALIBRATE_TP_OVERHEAD.name] = layer_overhead_s(cfg, job, profile(measured))
        measured["tp_layer_overhead_from"] = "the model split over 2 processes, over its plan"
    return measured


def figures_of(m: Mapping[str, Any]) -> dict[str, Any]:
    """Every figure of the profile a calibration measured, as the planner reads them."""
    out = profile(m)
    if CALIBRATE_TP_OVERHEAD.name in m:
        out["tp_layer_overhead_us"] = m[CALIBRATE_TP_OVERHEAD.name] * 1e6
    return out
