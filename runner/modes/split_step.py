"""mode=calibrate's measure of DTensor's cost per split layer, on the configured model itself.

The runner trains the model split over two processes (parallel.tp=2, a few steps, into a store of
its own) and reads the step time it measured; the planner, with the profile just measured and no
per-layer cost, plans the same job; what the measurement exceeds that by, per split layer and
micro-batch, is `tp_layer_overhead_us`. A tiny Linear pair timed apart measured 0.56-0.64 ms a
layer here, where the default decoder's split blocks cost about 3 ms a layer more than their
matrix products and all-reduces (its attention's views, SDPA and the vocabulary's loss on
DTensors): a tensor-parallel run took 36 % longer than planned.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from mlflow import MlflowClient
from omegaconf import DictConfig, OmegaConf

from runner.config import HardwareConfig
from runner.errors import ConfigError
from runner.job import Job, typed
from runner.layouts import traffic
from runner.mesh import Mesh
from runner.planner.hardware import software_stretch
from runner.planner.timing import split_layer_passes, step_time

STEPS = ["trainer.max_steps=10", "trainer.warmup_steps=3", "trainer.val_batches=0"]
QUIET = ["trainer.progress_bar=false", "hydra.run.dir=.", "hydra.output_subdir=null"]


def splits(job: Job) -> bool:
    try:
        job.spec.check_tensor(job.model, 2, job.stages)
    except ConfigError:
        return False
    return True


def measured_step_s(overrides: list[str]) -> float:
    """The runner's step time of the job split over two processes, trained in a temporary
    folder and store (nothing is written where the user works)."""
    keep = [o for o in overrides if not o.startswith(("mode=", "parallel", "hardware.devices"))]
    with tempfile.TemporaryDirectory() as tmp:
        store = f"sqlite:///{Path(tmp) / 'mlflow.db'}"
        args = [*keep, "mode=train", "parallel=tensor", "hardware.devices=2", *STEPS, *QUIET]
        done = subprocess.run(
            [sys.executable, "-m", "runner", *args, f"logger.tracking_uri={store}"],
            cwd=tmp,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if done.returncode:
            raise RuntimeError(f"the tensor-parallel step failed:\n{done.stderr[-2000:]}")
        client = MlflowClient(store)
        (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
        return run.data.metrics["step_time_s"]


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


def layer_overhead_s(cfg: DictConfig, job: Job, overrides: list[str], profile: dict) -> float:
    """Seconds per split layer and micro-batch that the measured split step exceeds the plan by."""
    split = split_job(job, cfg, profile)
    planned = step_time(split, traffic(split)).total_s
    passes = split_layer_passes(split) * software_stretch(split.hardware)
    return max(0.0, measured_step_s(overrides) - planned) / passes
