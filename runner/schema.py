"""Dataclass schemas of every config group, registered with Hydra's ConfigStore.

Each YAML option names its schema first in its defaults list, so a wrong type or an unknown key
fails at composition time, before anything is imported or launched. Nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from runner.models.registry import SPECS

# --- model: each model's schema lives in its folder (runner/models/<name>/config.py) ---


# --- data: where samples come from, how they are batched, and the loss that fits them ---
@dataclass
class DataConfig:
    _target_: str = MISSING  # a function returning runner.data.Splits
    batch_size: int = 32  # the global batch: every layout splits this one
    val_fraction: float = 0.1
    loss: str = MISSING  # mse | half_mse | bce | cross_entropy
    n_features: int = 0  # input width, for models that take vectors
    n_outputs: int = 0  # output width (classes, or 1 for a regression/binary target)


@dataclass
class TextDataConfig(DataConfig):
    _target_: str = "runner.data.text.load_text"
    loss: str = "cross_entropy"
    vocab_size: int = 2048
    seq_len: int = 64
    cache_dir: str = "${oc.env:XDG_CACHE_HOME,${oc.env:HOME}/.cache}/parallel-runner"


# --- parallel layout, hardware, trainer, logger ---
@dataclass
class ParallelConfig:
    # The device mesh: data-parallel replicas x pipeline stages x tensor-parallel shards. One size
    # may be null: it takes the processes the others leave (runner/mesh.py).
    dp: int | None = 1
    pp: int | None = 1
    tp: int | None = 1
    # DDP's gradient bucket size, one all-reduce per bucket; null: torch's default, 25 MiB after
    # a first bucket of 1 MiB, whose all-reduce starts while backward still runs
    bucket_cap_mb: float | None = None
    microbatches: int = 1  # pipeline: micro-batches per global batch (1: plain model parallelism)
    schedule: str = "1f1b"  # pipeline: gpipe | 1f1b | interleaved_1f1b | zero_bubble
    virtual_stages: int = 1  # pipeline: stages per rank (interleaved schedules)
    split: list[int] | None = None  # pipeline: layers per stage; None splits evenly


@dataclass
class LinkConfig:
    """One tier of the network, as a collective between devices of this tier sees it."""

    name: str = MISSING  # e.g. NVLink 4, InfiniBand NDR, gloo over loopback
    bandwidth_gbs: float = MISSING  # GB/s each way, per device
    latency_us: float = MISSING  # per message, software included
    efficiency: float = MISSING  # share of the bandwidth a collective reaches (0..1]


@dataclass
class HardwareConfig:
    accelerator: str = "cpu"  # cpu (gloo) | gpu (nccl)
    devices: int | None = None  # processes (one per device) per node; None: what the mesh needs
    nodes: int = 1  # more than 1: start one runner per node with torchrun or SLURM
    threads_per_rank: int | None = None  # None: cores / ranks
    keep_freed_memory: bool = True  # glibc's malloc keeps a step's freed memory for the next
    memory_gib: float | None = None  # per device; None: read from this host
    # Per device by dtype (fp32, bf16); on a CPU, the whole host's (its devices share the cores).
    peak_tflops: dict[str, float] = MISSING
    compute_efficiency: float = MISSING  # share of peak that a training step's matmuls reach
    step_overhead_s: float = 0.0  # fixed cost of every step: Python, framework, optimizer launch
    # Software cost of one tensor-parallel layer's forward and backward beyond its compute and
    # collectives (DTensor's dispatch), per micro-batch.
    tp_layer_overhead_us: float = 0.0
    power_w: float = MISSING  # per device (on a CPU: the host's, shared by its devices)
    pue: float = 1.0  # facility power / IT power
    usd_per_kwh: float = 0.10
    intra_node: LinkConfig = MISSING  # NVLink, PCIe, or loopback between processes of a host
    inter_node: LinkConfig = MISSING  # InfiniBand, RoCE, Ethernet
    # Which tier each mesh dimension's traffic crosses: intra_node | inter_node | auto (by where
    # its ranks sit: tp innermost, then dp, then pp, devices-per-node ranks to a node).
    tiers: dict[str, str] = field(default_factory=lambda: dict.fromkeys(("dp", "pp", "tp"), "auto"))


@dataclass
class TrainerConfig:
    max_steps: int = 200
    optimizer: str = "adamw"  # adamw | sgd
    lr: float = 1e-3
    weight_decay: float = 0.0
    val_every_n_steps: int = 50
    val_batches: int = 8  # batches per validation, 0 for none
    warmup_steps: int = 5  # steps left out of step time and throughput
    progress_bar: bool = True
    # false: losses and throughput only, no per-rank timing, traffic counting or timeline (the
    # baseline of what measuring costs: benchmarks/overhead.py)
    measure: bool = True


@dataclass
class LoggerConfig:
    tracking_uri: str = "${oc.env:MLFLOW_TRACKING_URI,sqlite:///mlflow.db}"
    experiment_name: str = "runner"
    run_name: str | None = None  # None: built from the model, layout and overrides


@dataclass
class FaultConfig:
    """Faults injected on purpose, to see what a lost rank does to the job and its record."""

    kill_rank: int | None = None  # this rank ends abruptly (SIGKILL) ...
    hang_rank: int | None = None  # ... or stays alive but stops taking part in collectives ...
    at_step: int | None = None  # ... when it starts this optimizer step
    disk_full_at_step: int | None = None  # the snapshot at this step fails: no space left


@dataclass
class DistConfig:
    """The process group's behaviour when something goes wrong."""

    # A collective that waits longer than this fails its rank, and so the job: what a lost or hung
    # rank costs before anyone notices.
    timeout_s: float = 600.0


@dataclass
class CheckpointConfig:
    """Snapshots of the whole training state, to resume from after a failure."""

    every_n_steps: int = 0  # 0: none
    dir: str = (
        "snapshots"  # <dir>/<run id>/step_<n>/, one file per rank (torch.distributed.checkpoint)
    )


@dataclass
class ExampleConfig:
    """A worked example of the seed, computed by the real model with autograd."""

    name: str = MISSING  # neuron | backprop
    inputs: list[float] = MISSING
    target: float | None = None
    lr: float | None = None
    shifted_bias: float | None = None
    # One {weight, bias} per Linear layer, in order: the seed's initial weights.
    weights: list[Any] = field(default_factory=list)


@dataclass
class PlanConfig:
    """mode=plan: no training; the model on the meta device, the job priced on the hardware."""

    hours: float | None = None  # a duration to price ...
    tokens: float | None = None  # ... or a token (sample) budget; neither: trainer.max_steps
    dtype: str = "fp32"  # fp32 | bf16 (mixed precision: bf16 weights and grads, fp32 Adam state)
    recompute: bool = False  # keep only each layer's input; recompute the rest in backward
    json: bool = False  # print one JSON object as the last line of standard output
    # Failures: Meta's Llama 3 405B run saw 419 interruptions in 54 days on 16,384 GPUs, one per
    # ~3.1 h for the job, ~51,000 h per GPU (Dubey et al. 2024, section 3.3.4).
    device_mtbf_hours: float = 50_000.0
    snapshot_write_s: float = 60.0  # time to write one snapshot of the job's state


@dataclass
class ReportConfig:
    """mode=report: a sweep's predicted figures next to its measured ones."""

    sweep: str | None = None  # the sweep's parent run id; None: the newest sweep


@dataclass
class Config:
    model: Any = MISSING
    data: Any = MISSING
    parallel: ParallelConfig = MISSING
    hardware: HardwareConfig = MISSING
    trainer: TrainerConfig = MISSING
    logger: LoggerConfig = MISSING
    seed: int = 0
    mode: str = "train"  # one of runner.choices.MODES
    example: ExampleConfig | None = None
    plan: PlanConfig = field(default_factory=PlanConfig)
    report: ReportConfig = field(default_factory=ReportConfig)
    fault: FaultConfig = field(default_factory=FaultConfig)
    dist: DistConfig = field(default_factory=DistConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    resume: str | None = None  # auto (the newest complete snapshot) or a run id


SCHEMAS: dict[str, dict[str, type]] = {
    "model": {name: spec.config for name, spec in SPECS.items()},
    "data": {"tabular": DataConfig, "text": TextDataConfig},
    "parallel": {"parallel": ParallelConfig},
    "hardware": {"hardware": HardwareConfig},
    "trainer": {"trainer": TrainerConfig},
    "logger": {"logger": LoggerConfig},
}


def register_configs() -> None:
    """Store every schema as `<group>/<name>_schema`, and the root as `config_schema`."""
    cs = ConfigStore.instance()
    cs.store(name="config_schema", node=Config)
    for group, schemas in SCHEMAS.items():
        for name, node in schemas.items():
            cs.store(group=group, name=f"{name}_schema", node=node)
