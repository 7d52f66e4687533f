"""Checks on a composed config, before any process starts or anything heavy is imported.

Types and unknown keys are already refused by the schemas. Each group's own rules live beside its
schema (runner/config/), a model's with its spec (runner/models/), a layout's with the layout
(runner/layouts/rules.py); here they run in order, with the rules that span groups: whether the
job fits the hardware, and whether the launcher agrees with the config. Each failure is one
ConfigError naming the key and what is allowed.
"""

from __future__ import annotations

import math
import os

from omegaconf import DictConfig

from runner.choices import MODES
from runner.config import check_known_keys
from runner.config.data import check_data
from runner.config.example import check_example
from runner.config.faults import check_fault
from runner.config.hardware import HardwareConfig, check_hardware, check_profile
from runner.config.logger import check_tracking
from runner.config.plan import check_plan
from runner.config.search import check_search
from runner.config.study import check_study
from runner.config.trainer import (
    check_attention,
    check_precision,
    check_recompute,
    check_sixteen_bit,
    check_trainer,
)
from runner.errors import ConfigError, one_of, require
from runner.job import Job, resolve_job
from runner.launcher.cluster import external_launcher, started_processes, world_size
from runner.layouts.rules import batch_for_plan, check_layout
from runner.mesh import DIMS, Mesh, resolve, shown_dims
from runner.network.emulation import check_emulation
from runner.planner.memory import memory_per_device_gib
from runner.units import count

__all__ = ["ConfigError", "check", "resolve_mesh", "validate"]


def host_memory_gib() -> float:
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30


def device_memory_gib(hw: HardwareConfig) -> float:
    """What one process may hold: a device's memory, or on a CPU its share of the host's."""
    have = hw.memory_gib or host_memory_gib()
    return have / hw.devices if hw.accelerator == "cpu" else have


def check_fits(job: Job) -> None:
    """Refuse to train what cannot fit, counted as the planner counts it for this layout (each
    device's share: tensor and pipeline parallelism split the model); on a CPU, the processes of
    the host share its memory. GPT-3 is for mode=plan, on the meta device."""
    hw, params = job.hardware, job.spec.params(job.model)
    need = memory_per_device_gib(job)["total"]
    cpu = hw.accelerator == "cpu"
    have = hw.memory_gib or host_memory_gib()
    sharing = f" x {hw.devices} processes on one host" if cpu else ""
    require(
        need <= device_memory_gib(hw),
        "model",
        f"{count(params)} parameters need {need:,.0f} GiB per device to train in this layout"
        f"{sharing} (weights, gradients, Adam state, activations); hardware has {have:,.0f} GiB:"
        " too large to train here",
    )


def check_launch(cfg: DictConfig) -> None:
    """What the environment says must agree with the config: who starts the processes, how many."""
    launched = external_launcher() is not None
    if cfg.hardware.emulate_network.enabled:
        check_emulation(cfg, launched)  # this host's ranks on every node, in namespaces
    elif cfg.hardware.nodes > 1:
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


def resolve_mesh(cfg: DictConfig) -> Mesh:
    """The explicit step before any check that needs sizes: fill hardware.devices and the mesh
    sizes left null (from the processes torchrun or SLURM started, where they did)."""
    check_known_keys(cfg)
    one_of(cfg.mode, "mode", MODES)
    check_study(cfg.study, cfg)  # a study's names, before the grid's first job runs
    check_hardware(cfg.hardware, cfg.mode == "train")  # the devices asked for exist here
    if external_launcher() == "srun":
        check_srun_tasks(cfg)
    if cfg.mode == "search":
        search_base(cfg)
    return resolve(cfg, started_processes() if external_launcher() else None)


def search_base(cfg: DictConfig) -> None:
    """mode=search sets the layout itself (runner/search/): the config's parallel group is set
    to plain data parallelism over every device, the base its layouts vary. A CPU profile
    without a device count searches this host's own cores."""
    p = cfg.parallel
    p.dp, p.pp, p.tp, p.cp, p.ep, p.microbatches = None, 1, 1, 1, 1, 1
    p.schedule, p.virtual_stages, p.split, p.shard, p.sequence_parallel = (
        "1f1b",
        1,
        None,
        "none",
        False,
    )
    if cfg.hardware.devices is None and cfg.hardware.accelerator == "cpu":
        cfg.hardware.devices = os.cpu_count() or 1
    require(cfg.hardware.devices is not None, "hardware.devices",
            "mode=search chooses the mesh over a node's devices: set how many a node has, "
            "e.g. hardware.devices=8")  # fmt: skip


def check_srun_tasks(cfg: DictConfig) -> None:
    """srun starts one rank per task: the tasks must be laid out per node, and as many as the
    mesh has processes. Lightning would refuse --ntasks alone mid-start, in a traceback."""
    p, nodes, started = cfg.parallel, cfg.hardware.nodes, started_processes()
    sizes = {d: p[d] for d in DIMS}
    needed = math.prod(sizes.values()) if None not in sizes.values() else started
    per_node = f"--nodes={nodes} --ntasks-per-node={max(needed // nodes, 1)}"
    require(
        "SLURM_NTASKS_PER_NODE" in os.environ,
        "hardware.devices",
        f"srun started {started} tasks by --ntasks; the runner takes one task per device on "
        f"each node: srun {per_node}",
    )
    require(
        needed == started,
        "parallel",
        f"srun started {started} tasks, but {' x '.join(shown_dims(sizes))} = {needed}: srun "
        f"{per_node}",
    )


def validate(cfg: DictConfig) -> Mesh:
    """Resolve the mesh, then check everything against it."""
    mesh = resolve_mesh(cfg)
    check(cfg, mesh)
    return mesh


def check(cfg: DictConfig, mesh: Mesh) -> Job | None:
    """Every rule, in order; the job resolved on the way (None for a model of the user's)."""
    if cfg.mode == "plan":
        batch_for_plan(cfg, mesh)
    if cfg.mode != "search":  # a search asks the layout rules of every layout it tries
        check_layout(cfg, mesh)  # the mesh says how much of the model each device holds
    check_profile(cfg.hardware)  # complete: the job's typed profile needs every field
    check_trainer(cfg.trainer)  # its precision sizes what the fit check counts
    check_precision(cfg.trainer, cfg.hardware, mesh, cfg.mode in ("train", "calibrate"))
    check_recompute(cfg.trainer, cfg.parallel.schedule, mesh)
    check_attention(cfg.trainer, mesh)
    check_sixteen_bit(cfg.trainer, cfg.parallel, mesh, cfg.mode, cfg.hardware.accelerator)
    job = resolve_job(cfg)  # None for a model of the user's
    if cfg.mode == "train" and job is not None:
        check_fits(job)  # then: nothing else matters for a model too large to train
    if job is not None:
        job.spec.check(job.model, job.data, cfg.mode == "train")
    check_data(cfg.data, job.spec.output_activation(job.model) if job else None)
    if cfg.mode == "example":
        check_example(cfg.example)
    elif cfg.mode in ("plan", "search"):
        check_plan(cfg.plan, cfg.model)
        if cfg.mode == "search":
            check_search(cfg.search)
    elif cfg.mode == "train":
        require(
            not cfg.plan.scatter_gather,
            "plan.scatter_gather",
            "is priced by mode=plan only: training sends whole activations between stages",
        )
        check_launch(cfg)
        check_fault(cfg)
    elif cfg.mode == "calibrate":
        require(
            world_size(cfg) == 1,
            "mode",
            "calibrate measures this host (or its GPU) with one process: drop the parallel "
            "overrides and hardware.devices",
        )
    check_tracking(cfg.logger.tracking_uri)  # last: the only check that waits on the network
    return job
