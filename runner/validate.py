"""Semantic checks on a composed config, before any process starts or anything heavy is imported.

Types and unknown keys are already refused by the schemas; these are the rules that span fields.
Each failure is one ConfigError naming the key and what is allowed.
"""

from __future__ import annotations

import os

from omegaconf import DictConfig, OmegaConf

from runner.choices import ACCELERATORS, DTYPES, EXAMPLES, LOSSES, MODES, OPTIMIZERS, TIERS
from runner.cluster import external_launcher, started_processes, world_size
from runner.errors import ConfigError, one_of, positive, require
from runner.job import Job, resolve_job
from runner.layouts.rules import check_layout
from runner.mesh import Mesh, resolve
from runner.models.registry import SPECS, spec_for
from runner.planner.memory import largest_layer_gib, memory_per_device_gib

PROFILE = ("peak_tflops", "compute_efficiency", "power_w", "intra_node", "inter_node")
LINK = ("name", "bandwidth_gbs", "latency_us", "efficiency")


__all__ = ["ConfigError", "check", "validate"]


def output_activation(m: DictConfig) -> str | None:
    return m.get("output_activation", m.get("activation"))


MIN_BPE_VOCAB = 256 + 2  # byte-level BPE keeps every byte, plus <pad> and <unk>


def check_data(cfg: DictConfig) -> None:
    positive(cfg.data, "data", "batch_size")
    vocab = cfg.data.get("vocab_size")
    if vocab is not None:
        require(vocab >= MIN_BPE_VOCAB, "data.vocab_size", f"must be {MIN_BPE_VOCAB} or more")
    require(0 <= cfg.data.val_fraction < 1, "data.val_fraction", "must be in [0, 1)")
    one_of(cfg.data.loss, "data.loss", LOSSES)
    if cfg.data.loss == "bce":
        act = output_activation(cfg.model)
        require(
            act == "sigmoid", "data.loss", f"bce needs a sigmoid output, the model ends in '{act}'"
        )


def check_trainer(t: DictConfig) -> None:
    positive(t, "trainer", "max_steps", "lr", "val_every_n_steps")
    require(t.weight_decay >= 0, "trainer.weight_decay", f"must be 0 or more, got {t.weight_decay}")
    one_of(t.optimizer, "trainer.optimizer", OPTIMIZERS)
    require(t.val_batches >= 0, "trainer.val_batches", f"must be 0 or more, got {t.val_batches}")
    require(
        0 <= t.warmup_steps < t.max_steps,
        "trainer.warmup_steps",
        f"must be in 0..trainer.max_steps-1 (timing needs steps after it), got {t.warmup_steps}",
    )


def host_memory_gib() -> float:
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30


def check_fits(job: Job) -> None:
    """Refuse to train what cannot fit, counted as the planner counts it for this layout (each
    device's share: tensor and pipeline parallelism split the model); on a CPU, the processes of
    the host share its memory. GPT-3 is for mode=plan, on the meta device."""
    hw, params = job.hardware, job.spec.params(job.model)
    need = memory_per_device_gib(job, "fp32")["total"]
    cpu = hw.accelerator == "cpu"
    have = hw.memory_gib or host_memory_gib()
    sharing = f" x {hw.devices} processes on one host" if cpu else ""
    require(
        need * (hw.devices if cpu else 1) <= have,
        "model",
        f"{params / 1e9:.1f} B parameters need {need:,.0f} GiB per device to train in this layout"
        f"{sharing} (weights, gradients, Adam state, activations); hardware has {have:,.0f} GiB:"
        " too large to train here",
    )


def check_layer_fits(job: Job, dtype: str) -> None:
    """A plan may split a model until one layer is left per device; not below that."""
    need, have = largest_layer_gib(job, dtype), job.hardware.memory_gib or host_memory_gib()
    require(
        need <= have,
        "hardware.memory_gib",
        f"{have:,.0f} GiB per device cannot hold even one layer of this model ({need:,.0f} GiB "
        "with its gradients and optimizer state, split as parallel.tp says)",
    )


def check_hardware(cfg: DictConfig) -> None:
    positive(cfg.hardware, "hardware", "nodes")
    one_of(cfg.hardware.accelerator, "hardware.accelerator", ACCELERATORS)
    threads = cfg.hardware.threads_per_rank
    require(threads is None or threads > 0, "hardware.threads_per_rank", "must be positive or null")
    if cfg.hardware.accelerator == "gpu" and cfg.mode == "train":
        import torch  # only when a GPU is asked for: the CPU path stays free of heavy imports

        require(
            torch.cuda.is_available(), "hardware.accelerator", "gpu, but no CUDA device is visible"
        )


def missing(node: DictConfig, prefix: str, *names: str) -> None:
    for name in names:
        require(
            not OmegaConf.is_missing(node, name),
            f"{prefix}.{name}",
            "missing: every hardware profile gives it (see conf/hardware/)",
        )


def fraction(value: float, key: str) -> None:
    require(0 < value <= 1, key, f"must be in (0, 1], got {value}")


def check_profile(hw: DictConfig) -> None:
    """A hardware profile is complete and physical: the planner prices jobs with it."""
    missing(hw, "hardware", *PROFILE)
    positive(hw, "hardware", "power_w", "pue")
    fraction(hw.compute_efficiency, "hardware.compute_efficiency")
    for name in ("usd_per_kwh", "step_overhead_s", "tp_layer_overhead_us"):
        require(hw[name] >= 0, f"hardware.{name}", f"must be 0 or more, got {hw[name]}")
    require(hw.memory_gib is None or hw.memory_gib > 0, "hardware.memory_gib", "must be positive")
    for dtype, tflops in hw.peak_tflops.items():
        require(tflops > 0, f"hardware.peak_tflops.{dtype}", f"must be positive, got {tflops}")
    for tier in ("intra_node", "inter_node"):
        link = hw[tier]
        missing(link, f"hardware.{tier}", *LINK)
        positive(link, f"hardware.{tier}", "bandwidth_gbs")
        require(link.latency_us >= 0, f"hardware.{tier}.latency_us", "must be 0 or more")
        fraction(link.efficiency, f"hardware.{tier}.efficiency")
    for dim, tier in hw.tiers.items():
        one_of(dim, "hardware.tiers", ("dp", "pp", "tp"))
        one_of(tier, f"hardware.tiers.{dim}", TIERS)


def check_plan(cfg: DictConfig) -> None:
    p = cfg.plan
    require(
        spec_for(cfg.model) is not None,
        "model",
        f"the planner sizes the models of runner/models/ only ({', '.join(SPECS)})",
    )
    one_of(p.dtype, "plan.dtype", DTYPES)
    require(p.dtype in cfg.hardware.peak_tflops, "hardware.peak_tflops", f"has no {p.dtype} figure")
    require(p.hours is None or p.tokens is None, "plan.hours", "give plan.hours or plan.tokens")
    for key in ("hours", "tokens"):
        require(p[key] is None or p[key] > 0, f"plan.{key}", f"must be positive, got {p[key]}")


def check_launch(cfg: DictConfig) -> None:
    """What the environment says must agree with the config: who starts the processes, how many."""
    launched = external_launcher() is not None
    if cfg.hardware.nodes > 1:
        require(
            launched,
            "hardware.nodes",
            f"{cfg.hardware.nodes} nodes: start a runner per node with torchrun or SLURM"
            " (docs/parallelism.md)",
        )
    if launched:
        started = started_processes()
        require(
            started == world_size(cfg),
            "hardware.devices",
            f"{started} processes were started, but hardware.devices x hardware.nodes = "
            f"{world_size(cfg)}",
        )


def check_fault(cfg: DictConfig) -> None:
    f, world = cfg.fault, world_size(cfg)
    every = cfg.checkpoint.every_n_steps
    require(every >= 0, "checkpoint.every_n_steps", f"must be 0 (none) or more, got {every}")
    full = f.disk_full_at_step
    require(
        full is None or (every > 0 and full > 0 and full % every == 0),
        "fault.disk_full_at_step",
        f"must be a step that takes a snapshot (a multiple of checkpoint.every_n_steps={every})",
    )
    require(cfg.dist.timeout_s > 0, "dist.timeout_s", f"must be positive, got {cfg.dist.timeout_s}")
    require(
        f.kill_rank is None or f.hang_rank is None,
        "fault.hang_rank",
        "one fault at a time: fault.kill_rank is set too",
    )
    for key in ("kill_rank", "hang_rank"):
        if f[key] is None:
            continue
        require(
            world > 1 and 0 <= f[key] < world,
            f"fault.{key}",
            f"must be a rank of a job of 2 or more processes (0..{world - 1}), got {f[key]}",
        )
        require(
            f.at_step is not None and 0 <= f.at_step < cfg.trainer.max_steps,
            "fault.at_step",
            f"must be a step in 0..trainer.max_steps-1, got {f.at_step}",
        )


def check_tracking(uri: str, timeout_s: float = 5.0) -> None:
    """An MLflow server must answer before anything trains: a job that cannot record is lost."""
    if not uri.startswith(("http://", "https://")):
        return  # a local store: nothing to reach
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=timeout_s) as answer:
            answer.read()
    except (urllib.error.URLError, OSError) as failure:
        reason = getattr(failure, "reason", failure)
        raise ConfigError(
            "logger.tracking_uri", f"no MLflow server answers at {uri} ({reason})"
        ) from None


def check_example(cfg: DictConfig) -> None:
    require(cfg.example is not None, "example", "mode=example needs an example (see experiments/)")
    one_of(cfg.example.name, "example.name", EXAMPLES)


def validate(cfg: DictConfig) -> Mesh:
    """Resolve the mesh (an explicit step: it fills hardware.devices and the sizes left null),
    then check everything against it."""
    one_of(cfg.mode, "mode", MODES)
    check_hardware(cfg)  # the devices asked for exist here
    devices = cfg.hardware.devices
    require(devices is None or devices > 0, "hardware.devices", "must be positive or null")
    mesh = resolve(cfg, started_processes() if external_launcher() else None)
    check(cfg, mesh)
    return mesh


def check(cfg: DictConfig, mesh: Mesh) -> None:
    check_layout(cfg, mesh)  # the mesh says how much of the model each device holds
    check_profile(cfg.hardware)  # complete: the job's typed profile needs every field
    job = resolve_job(cfg)  # None for a model of the user's
    if cfg.mode == "train" and job is not None:
        check_fits(job)  # then: nothing else matters for a model too large to train
    if job is not None:
        job.spec.check(job.model, job.data, cfg.mode == "train")
    check_data(cfg)
    check_trainer(cfg.trainer)
    if cfg.mode == "train":  # the runner trains in fp32: its predictions need that figure
        require("fp32" in cfg.hardware.peak_tflops, "hardware.peak_tflops", "needs an fp32 figure")
    if cfg.mode == "example":
        check_example(cfg)
    elif cfg.mode == "plan":
        check_plan(cfg)
        check_layer_fits(job, cfg.plan.dtype)
    elif cfg.mode == "train":
        check_launch(cfg)
        check_fault(cfg)
    elif cfg.mode == "calibrate":
        require(
            world_size(cfg) == 1 and cfg.hardware.accelerator == "cpu",
            "mode",
            "calibrate measures this host with one process: drop parallel and hardware overrides",
        )
    check_tracking(cfg.logger.tracking_uri)  # last: the only check that waits on the network
