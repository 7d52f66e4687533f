"""This host's own figures for a CPU profile (hardware.figures=host): what mode=calibrate measured
here, kept under the runner's cache folder and keyed by what sets them, so that a study that
compares measured with predicted prices with the host it runs on, not the one its profile was
measured on (conf/hardware/cpu_core.yaml's figures came from a CPU with AVX-512 BF16; an AVX2-only
EPYC's bf16 products run 50x slower than its fp32 ones, its fp32 ones at another speed again).

The key: the CPU's model name and the cores this process may use (the host), the threads a rank
gets, torch's version (its kernels), and the profile and model the calibration ran (a step's
share in matrix products, what DDP adds per MB, are the model's). Torch-free: read by the job
before anything heavy is imported; runner/modes/calibrate/host.py measures and writes.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

# What a calibration measures of a CPU host and the planner reads (runner/modes/calibrate's
# profile()): the rest of the profile (power, price, its inter-node link) stays the profile's.
MEASURED = (
    "peak_tflops",
    "gemm_efficiency",
    "memory_bandwidth_gbs",
    "workspace_mib",
    "compute_efficiency",
    "step_overhead_s",
    "cores",
    "intra_node",
    "ddp_overhead_us_per_mb",
    "tp_layer_overhead_us",
)


def cpu_model() -> str:
    """The CPU's model name as /proc/cpuinfo gives it (lscpu's "Model name")."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown CPU"
    found = re.search(r"^model name\s*:\s*(.+)$", text, re.MULTILINE)
    return found.group(1).strip() if found else "unknown CPU"


def torch_version() -> str:
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return "unknown"


@dataclass(frozen=True)
class Host:
    """What a calibration's figures hold for: this host, at so many threads a rank."""

    cpu: str
    cores: int
    threads: int
    torch: str

    @classmethod
    def here(cls, threads_per_rank: int | None) -> Host:
        cores = len(os.sched_getaffinity(0))
        return cls(cpu_model(), cores, threads_per_rank or cores, torch_version())

    @property
    def key(self) -> str:
        slug = re.sub(r"[^a-z0-9]+", "-", self.cpu.lower()).strip("-")
        return f"{slug}-{self.cores}cores-{self.threads}threads-torch{self.torch}"

    def __str__(self) -> str:
        threads = f"{self.threads} thread(s) a rank"
        return f"{self.cpu}, {self.cores} cores, {threads}, torch {self.torch}"


HOSTS_ENV = "PARALLEL_RUNNER_HOSTS"  # another folder for them (the test suite's own)


def cache_root() -> Path:
    """hosts/ of the runner's cache folder (as data.cache_dir's default: $XDG_CACHE_HOME or
    ~/.cache), or the folder $PARALLEL_RUNNER_HOSTS names."""
    if os.environ.get(HOSTS_ENV):
        return Path(os.environ[HOSTS_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "parallel-runner" / "hosts"


@dataclass(frozen=True)
class Calibrated:
    """What a kept calibration measured: the profile, the model and its precision, and whether
    DTensor's cost was measured on the model split over 2 ranks (tensor-parallel jobs)."""

    profile: str
    model: str
    precision: str
    split: bool

    def __str__(self) -> str:
        split = ", split over 2 ranks" if self.split else ""
        return f"profile {self.profile}, model {self.model} at {self.precision}{split}"

    def path(self, host: Host) -> Path:
        split = "-split" if self.split else ""
        name = f"{self.profile}-{self.model}-{self.precision}{split}.yaml"
        return cache_root() / host.key / name


def load(path: Path) -> dict[str, Any] | None:
    """A kept calibration ({"priced_by": ..., "figures": ...}), or None where there is none."""
    if not path.is_file():
        return None
    kept = yaml.safe_load(path.read_text())
    return kept if isinstance(kept, dict) and "figures" in kept else None


def save(path: Path, host: Host, what: Calibrated, figures: dict[str, Any]) -> None:
    """Keep a calibration's figures for this host, with the line that says what priced a run."""
    import datetime

    day = datetime.date.today().isoformat()
    kept = {
        "priced_by": f"this host's figures ({host}; calibrated {day}, {what})",
        "figures": {k: v for k, v in figures.items() if k in MEASURED},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(kept, sort_keys=False))
    tmp.replace(path)  # whole or not at all: a second sweep may read it
