"""What one device of a hardware profile can do: FLOP/s, memory, power, and which network tier
each mesh dimension's traffic crosses."""

from __future__ import annotations

import os

from runner.config import HardwareConfig, LinkConfig
from runner.config.hardware import processes_per_host
from runner.mesh import RANKS_OF, Mesh


def device_share(hw: HardwareConfig) -> float:
    """On a CPU the profile describes the host, whose cores and power its processes share (on an
    emulated network, every node's). A rank given fewer threads than its share of the cores
    (hardware.threads_per_rank) computes on those alone: one process with one thread of two
    cores reaches half the host's rate, not all of it."""
    if hw.accelerator != "cpu":
        return 1
    processes = processes_per_host(hw)
    if hw.threads_per_rank is None:
        return processes
    return max(processes, host_cores(hw) / hw.threads_per_rank)


def host_cores(hw: HardwareConfig) -> int:
    return hw.cores or len(os.sched_getaffinity(0))


def flops_per_device(hw: HardwareConfig, dtype: str) -> float:
    """FLOP/s a device reaches in a training step's matmuls."""
    return hw.peak_tflops[dtype] * 1e12 * hw.compute_efficiency / device_share(hw)


def software_stretch(hw: HardwareConfig) -> float:
    """How much longer a process's own software work takes where a CPU host's processes
    outnumber its cores (they take turns on them): processes / cores, at least 1."""
    if hw.accelerator != "cpu":
        return 1.0
    return max(1.0, processes_per_host(hw) / host_cores(hw))


def power_per_device_w(hw: HardwareConfig) -> float:
    return hw.power_w / device_share(hw)


def tier(hw: HardwareConfig, mesh: Mesh, dim: str) -> LinkConfig:
    """The link a dimension's collectives cross."""
    return getattr(hw, tier_name(hw, mesh, dim))


def tier_name(hw: HardwareConfig, mesh: Mesh, dim: str) -> str:
    """intra_node or inter_node: ranks fill nodes in order (tp innermost, then cp, dp, pp), and a
    dimension stays inside a node if its ranks' span does."""
    dim = RANKS_OF.get(dim, dim)  # sequence parallelism's collectives cross tp's link
    chosen = hw.tiers.get(dim, "auto")
    if chosen == "auto":
        inner = {"tp": 1, "cp": mesh.tp, "dp": mesh.tp * mesh.cp, "pp": mesh.world // mesh.pp}
        inner["ep"] = inner["dp"]  # an ep group: neighbouring data-parallel ranks
        span = inner[dim] * getattr(mesh, dim)
        inside = span <= hw.devices and hw.devices % span == 0  # no group straddles two nodes
        chosen = "intra_node" if inside else "inter_node"
    return chosen


def copies_on_busy_cores(hw: HardwareConfig, mesh: Mesh, dim: str) -> bool:
    """A dimension's transfers over a CPU host's own loopback where its ranks' threads fill its
    cores: moving bytes there is those cores' own copying, so no computation runs beside it
    (measured: DDP's 2.6 MB all-reduce, 3.2 ms alone, added all of it to a step, and more)."""
    if hw.accelerator != "cpu" or tier_name(hw, mesh, dim) != "intra_node":
        return False
    processes, cores = processes_per_host(hw), host_cores(hw)
    return processes * (hw.threads_per_rank or cores / processes) >= cores


def transfer_s(link: LinkConfig, calls: float, wire_bytes: float) -> float:
    """Latency per call plus bytes at the bandwidth a collective reaches on this link."""
    return calls * link.latency_us * 1e-6 + wire_bytes / (
        link.bandwidth_gbs * 1e9 * link.efficiency
    )
