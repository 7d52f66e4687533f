"""The trainer group: steps, optimizer, learning rate, validation, warm-up; and its rules."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from runner.choices import (
    ATTENTION,
    FP8_RECIPES,
    GRAD_REDUCE,
    OPTIMIZERS,
    PRECISIONS,
    RECOMPUTE,
)
from runner.errors import one_of, positive, require
from runner.mesh import Mesh
from runner.precision import precision_of


@dataclass
class TrainerConfig:
    max_steps: int = 200
    optimizer: str = "adamw"  # one of runner.choices.OPTIMIZERS
    lr: float = 1e-3
    weight_decay: float = 0.0
    val_every_n_steps: int = 50
    val_batches: int = 8  # batches per validation, 0 for none
    warmup_steps: int = 5  # steps left out of step time and throughput
    progress_bar: bool = True
    # false: losses and throughput only, no per-rank timing, traffic counting or timeline (the
    # baseline of what measuring costs: benchmarks/overhead.py)
    measure: bool = True
    # one of runner.choices.PRECISIONS (runner/precision.py, docs/gpus.md): 32-true | bf16-mixed,
    # 16-mixed (Lightning's autocast over fp32 weights) | bf16-true (16-bit weights over fp32
    # master weights) | fp8 (bf16-true, the blocks' linear layers in float8 by torchao)
    precision: str = "32-true"
    # what bf16-true's and fp8's gradients are accumulated and reduced in: fp32 | bf16
    grad_reduce: str = "fp32"
    fp8_recipe: str = "tensorwise"  # fp8's scaling, torchao's recipe: tensorwise | rowwise
    compile: bool = False  # torch.compile the model (one device or data parallelism)
    tf32: bool = False  # fp32 matmuls on TF32 tensor cores (GPUs from Ampere on)
    # activations kept for backward, one of runner.choices.RECOMPUTE: none | full (each layer
    # keeps its input, re-runs its forward in backward) | selective (keeps matrix products',
    # attention's, all-reduces' and reduce-scatters' outputs; recomputes the rest, all-gathers
    # included): runner/models/recompute.py
    recompute: str = "none"
    # attention's kernel, one of runner.choices.ATTENTION: auto (torch's SDPA picks: a fused
    # kernel where it can, which keeps no scores and computes the causal half) | math (its math
    # path: the whole square, scores kept; Megatron-LM's before flash attention)
    attention: str = "auto"
    # 0: off; N: a torch.profiler trace of one step in every N after warm-up, on every rank,
    # read as Holistic Trace Analysis reads it (runner/training/sampled_profile.py)
    profile_every_n_steps: int = 0


def check_trainer(t: Any) -> None:
    positive(t, "trainer", "max_steps", "lr", "val_every_n_steps")
    require(t.weight_decay >= 0, "trainer.weight_decay", f"must be 0 or more, got {t.weight_decay}")
    one_of(t.optimizer, "trainer.optimizer", OPTIMIZERS)
    one_of(t.precision, "trainer.precision", PRECISIONS)
    one_of(t.grad_reduce, "trainer.grad_reduce", GRAD_REDUCE)
    one_of(t.fp8_recipe, "trainer.fp8_recipe", FP8_RECIPES)
    one_of(t.recompute, "trainer.recompute", RECOMPUTE)
    one_of(t.attention, "trainer.attention", ATTENTION)
    require(t.val_batches >= 0, "trainer.val_batches", f"must be 0 or more, got {t.val_batches}")
    every = t.profile_every_n_steps
    require(every >= 0, "trainer.profile_every_n_steps", f"must be 0 (off) or more, got {every}")
    # No more steps than warm-up is a short run, not an error: it trains and records its losses,
    # without the figures that need timed steps (runner/training/record.py says so).
    require(t.warmup_steps >= 0, "trainer.warmup_steps", f"must be 0 or more, got {t.warmup_steps}")


def check_precision(t: Any, hw: Any, mesh: Mesh, train: bool) -> None:
    """What the precision, compile and TF32 options ask of the hardware and the layout."""
    split, masters = mesh.tp > 1 or mesh.pp > 1, precision_of(t).masters
    require(
        t.grad_reduce == "fp32" or masters,
        "trainer.grad_reduce",
        f"bf16 sums 16-bit weights' gradients (trainer.precision=bf16-true or fp8); "
        f"{t.precision} keeps fp32 gradients: leave it fp32",
    )
    require(
        not (t.precision == "16-mixed" and hw.accelerator == "cpu"),
        "trainer.precision",
        "16-mixed (fp16 autocast) runs on GPUs only; on a CPU use bf16-mixed or 32-true",
    )
    require(
        not (t.precision == "16-mixed" and split),
        "trainer.precision",
        "16-mixed scales the loss, which the pipeline schedule's backward and DTensor-split layers "
        "do not take here; use bf16-mixed (no scaling needed) or 32-true",
    )
    require(
        not (t.compile and split),
        "trainer.compile",
        "compiles one device or data parallelism (parallel.tp and parallel.pp 1): pipeline "
        "stages and tensor-parallel layers run eagerly",
    )
    require(
        not (t.tf32 and hw.accelerator == "cpu"),
        "trainer.tf32",
        "TF32 is a GPU tensor-core format (Ampere on); hardware.accelerator is cpu",
    )
    for compute in precision_of(t).computes:
        require(
            compute in hw.peak_tflops,
            "hardware.peak_tflops",
            f"has no {compute} figure, which trainer.precision={t.precision} needs "
            f"(it has {', '.join(hw.peak_tflops)})",
        )
    if train and hw.accelerator == "gpu":
        check_gpu_precision(t)


def check_sixteen_bit(t: Any, p: Any, mesh: Mesh, mode: str, accelerator: str) -> None:
    """Where 16-bit weights over fp32 masters train (FSDP2's mixed precision on every replica:
    runner/layouts/sharded/shard.py); mode=plan and mode=search price every layout."""
    if not precision_of(t).masters or mode not in ("train", "calibrate"):
        return
    key, name = "trainer.precision", t.precision
    require(mode == "train", key, f"{name}: mode=calibrate measures 32-true and bf16-mixed loops")
    require(
        p.shard != "none" or mesh.size("dp") == 1,
        "parallel.shard",
        f"none, but {name}'s replicas (and their cp ranks) keep their fp32 masters in FSDP2's "
        "shards: use optimizer (Megatron's distributed optimizer), gradients or full",
    )
    if name == "fp8":
        check_float8(mesh, accelerator)


TORCH_FOR_CPU_FLOAT8 = (2, 13)  # the first release whose CPU torch._scaled_mm takes float8 here


def check_float8(mesh: Mesh, accelerator: str) -> None:
    """What torchao's float8 training needs here (runner/models/float8.py)."""
    require(
        mesh.tp == 1,
        "trainer.precision",
        "fp8 with parallel.tp: torchao's float8 layers take tensor-parallel splits through "
        "their own styles, not built here; use bf16-true with parallel.tp",
    )
    require(
        importlib.util.find_spec("torchao") is not None,
        "trainer.precision",
        "fp8 trains through torchao's float8 layers, which are not installed: pip install torchao",
    )
    version = tuple(int(part) for part in metadata.version("torch").split(".")[:2])
    need = ".".join(map(str, TORCH_FOR_CPU_FLOAT8))
    require(
        accelerator != "cpu" or version >= TORCH_FOR_CPU_FLOAT8,
        "trainer.precision",
        f"fp8 on a CPU needs torch >= {need} (its CPU float8 products); this is "
        f"{metadata.version('torch')}",
    )


def check_attention(t: Any, mesh: Mesh) -> None:
    """The ring attention is its own kernel."""
    require(
        not (t.attention == "math" and mesh.cp > 1),
        "trainer.attention",
        "math with parallel.cp: context parallelism runs its own ring attention "
        "(runner/layouts/context/ring.py), which keeps no scores; use auto",
    )


def check_recompute(t: Any, schedule: str, mesh: Mesh) -> None:
    """Recomputation runs once per backward; zero_bubble splits a stage's backward in two."""
    require(
        not (t.recompute != "none" and mesh.pp > 1 and schedule == "zero_bubble"),
        "trainer.recompute",
        f"{t.recompute} with parallel.schedule=zero_bubble: its backward runs in two passes "
        "(input, then weight gradients), each of which would recompute, and selective "
        "checkpointing allows one; use another schedule or trainer.recompute=none",
    )


def check_gpu_precision(t: Any) -> None:
    import torch  # only when training on a GPU: the CPU path stays free of heavy imports

    require(
        precision_of(t).compute != "bf16" or torch.cuda.is_bf16_supported(),
        "trainer.precision",
        f"{t.precision}, but {torch.cuda.get_device_name()} has no bf16: use 16-mixed or 32-true",
    )
    require(
        t.precision != "fp8" or torch.cuda.get_device_capability() >= (8, 9),
        "trainer.precision",
        f"fp8, but {torch.cuda.get_device_name()} has no float8 tensor cores (Ada, Hopper on)",
    )
    require(
        not t.tf32 or torch.cuda.get_device_capability() >= (8, 0),
        "trainer.tf32",
        f"{torch.cuda.get_device_name()} has no TF32 tensor cores (Ampere on)",
    )
