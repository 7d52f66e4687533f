"""mode=calibrate's measure of DTensor's cost per split layer, on the configured model itself.

The runner trains the model split over two processes (parallel.tp=2, a few steps, launched from
this process as any job of two is, recorded nowhere) and reads the step time it measured; the
planner, with the profile just measured and no per-layer cost, plans the same job; what the
measurement exceeds that by, per split layer and micro-batch, is `tp_layer_overhead_us`. A tiny
Linear pair timed apart measured 0.56-0.64 ms a layer here, where the default decoder's split
blocks cost about 3 ms a layer more than their matrix products and all-reduces (its attention's
views, SDPA and the vocabulary's loss on DTensors): a tensor-parallel run took 36 % longer than
planned.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from omegaconf import DictConfig, OmegaConf

from runner.config import HardwareConfig, ParallelConfig
from runner.errors import ConfigError
from runner.job import Job, typed
from runner.launcher.cluster import bind_gloo_to_loopback
from runner.launcher.fork_server import start_fork_server
from runner.launcher.launch import spawn
from runner.layouts import traffic
from runner.mesh import Mesh
from runner.metrics import STEP_TIME
from runner.planner.hardware import software_stretch
from runner.planner.timing import split_layer_passes, step_time
from runner.validate import check, resolve_mesh

STEPS = {"max_steps": 10, "warmup_steps": 3, "val_batches": 0, "progress_bar": False}


def splits(job: Job) -> bool:
    try:
        job.spec.check_tensor(job.model, 2, job.stages)
    except ConfigError:
        return False
    return True


def split_config(cfg: DictConfig) -> DictConfig:
    """The calibrated job as `parallel=tensor hardware.devices=2` gives it, a few steps, no
    snapshot: the layout's other settings at their defaults."""
    layout = OmegaConf.structured(ParallelConfig(dp=1, pp=1, tp=2, microbatches=1))
    split = OmegaConf.merge(cfg, {"mode": "train", "trainer": STEPS, "hardware": {"devices": 2}})
    split.parallel = layout
    split.checkpoint.every_n_steps = 0
    check(split, resolve_mesh(split))
    return split


def measured_step_s(cfg: DictConfig) -> float:
    """The runner's step time of the job split over two processes, launched from this process as
    any job of two is (runner/launcher/launch.py) and recorded nowhere: no MLflow run, no
    snapshot."""
    resolved = OmegaConf.to_container(split_config(cfg), resolve=True)
    bind_gloo_to_loopback()
    start_fork_server()
    return spawn(resolved, 2)[STEP_TIME.name]


def split_job(job: Job, cfg: DictConfig, profile: dict[str, Any]) -> Job:
    """The job over two tensor-parallel processes, on the measured profile without the cost."""
    given = OmegaConf.to_container(cfg.hardware, resolve=True)  # plain: the curves add keys
    hardware = OmegaConf.merge(given, profile, {"devices": 2, "tp_layer_overhead_us": 0})
    return dataclasses.replace(
        job,
        mesh=Mesh(tp=2),
        parallel=dataclasses.replace(job.parallel, dp=1, pp=1, tp=2),
        hardware=typed(HardwareConfig, hardware),
    )


def layer_overhead_s(cfg: DictConfig, job: Job, profile: dict) -> float:
    """Seconds per split layer and micro-batch that the measured split step exceeds the plan by."""
    split = split_job(job, cfg, profile)
    planned = step_time(split, traffic(split)).total_s
    passes = split_layer_passes(split) * software_stretch(split.hardware)
    return max(0.0, measured_step_s(cfg) - planned) / passes
