"""The hardware group: a device, the network between devices, power and price; and its rules
(a profile must be complete and physical: the planner prices jobs with it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING, OmegaConf

from runner.choices import ACCELERATORS, FIGURES, TIERS
from runner.errors import one_of, positive, require
from runner.mesh import LINK_DIMS

PROFILE = ("peak_tflops", "compute_efficiency", "power_w", "intra_node", "inter_node")
LINK = ("name", "bandwidth_gbs", "latency_us", "efficiency")


@dataclass
class LinkConfig:
    """One tier of the network, as a collective between devices of this tier sees it."""

    name: str = MISSING  # e.g. NVLink 4, InfiniBand NDR, gloo over loopback
    bandwidth_gbs: float = MISSING  # GB/s each way, per device
    latency_us: float = MISSING  # per message, software included
    efficiency: float = MISSING  # share of the bandwidth a collective reaches (0..1]


@dataclass
class EmulatedNetwork:
    """Nodes on emulated links on this Linux host (runner/network/emulation.py): each node's ranks
    in a network namespace of their own, its link to the others shaped to the profile's
    inter_node bandwidth."""

    enabled: bool = False
    # Nodes whose link is shaped to slow_share of the others' rate: a straggler the run names
    slow_nodes: list[int] = field(default_factory=list)
    slow_share: float = 0.25


@dataclass
class HardwareConfig:
    accelerator: str = "cpu"  # cpu (gloo) | gpu (nccl)
    devices: int | None = None  # processes (one per device) per node; None: what the mesh needs
    nodes: int = 1  # more than 1: start one runner per node with torchrun or SLURM
    threads_per_rank: int | None = None  # None: cores / ranks
    # A CPU host's cores (None: this host's). Processes beyond them share them, and each one's
    # software costs (step_overhead_s, tp_layer_overhead_us) stretch by processes / cores.
    cores: int | None = None
    keep_freed_memory: bool = True  # glibc's malloc keeps a step's freed memory for the next
    # Each Linear's forward takes this much more (backward twice), its rank's thread sleeping: a
    # device that computes while its host waits, for more ranks than cores (runner/models/
    # device_time.py). None: what the host computes, as it computes it.
    emulated_linear_ms: float | None = None
    memory_gib: float | None = None  # per device; None: read from this host
    # Per device by the key a precision computes at (fp32, tf32, bf16, fp16: runner/precision.py);
    # on a CPU, the whole host's (its devices share the cores).
    peak_tflops: dict[str, float] = MISSING
    # Share of peak a matrix product of size n reaches, n the cube root of m*n*k: points [n,
    # share] per peak_tflops key, read between points on a log scale (runner/planner/gemm.py);
    # a key without points: every product at peak. mode=calibrate measures them.
    gemm_efficiency: dict[str, list[Any]] = field(default_factory=dict)
    memory_bandwidth_gbs: float | None = None  # per device; caps thin products (the roofline)
    # What the math library keeps once it has run a product, per device, in MiB, by the key a
    # precision computes at: cuBLAS's workspace on a GPU (PyTorch's default, allocated by its
    # caching allocator), the BLAS's and oneDNN's packing buffers on a CPU. A key missing: none.
    # mode=calibrate measures the job's.
    workspace_mib: dict[str, float] = field(default_factory=dict)
    # Share of a step's compute time its matrix products take, at the speeds above: the rest is
    # norms, softmax, element-wise work, the optimizer and launches.
    compute_efficiency: float = MISSING
    step_overhead_s: float = 0.0  # fixed cost of every step: Python, framework, optimizer launch
    # Software cost of one tensor-parallel layer's forward and backward beyond its compute and
    # collectives (DTensor's dispatch), per micro-batch.
    tp_layer_overhead_us: float = 0.0
    # What data parallelism's runtime (DDP) adds to a step per MB of gradients beyond what the
    # link prices its all-reduce at: copying gradients into its buckets and out, its hooks, and
    # on a CPU gloo's threads taking turns with the compute on the same cores.
    ddp_overhead_us_per_mb: float = 0.0
    power_w: float = MISSING  # per device (on a CPU: the host's, shared by its devices)
    pue: float = 1.0  # facility power / IT power
    usd_per_kwh: float = 0.10
    intra_node: LinkConfig = MISSING  # NVLink, PCIe, or loopback between processes of a host
    inter_node: LinkConfig = MISSING  # InfiniBand, RoCE, Ethernet
    # Which tier each mesh dimension's traffic crosses: intra_node | inter_node | auto (by where
    # its ranks sit: tp innermost, then cp, dp, pp, devices-per-node ranks to a node).
    tiers: dict[str, str] = field(default_factory=lambda: dict.fromkeys(LINK_DIMS, "auto"))
    emulate_network: EmulatedNetwork = field(default_factory=EmulatedNetwork)
    # Whose figures price a CPU job: the profile's as written (measured on the host named in its
    # file), or this host's own, measured once by mode=calibrate and kept under the runner's
    # cache folder by host (runner/planner/host_figures.py): a study that compares measured with
    # predicted then prices with the host it runs on.
    figures: str = "profile"  # profile | host
    calibrated: str | None = None  # written by figures=host: the calibration that priced the job


def processes_per_host(hw: Any) -> int:
    """The processes that share a host's cores: a node's, or on an emulated network every
    node's (they all run on this host)."""
    return hw.devices * (hw.nodes if hw.emulate_network.enabled else 1)


def check_hardware(hw: Any, train: bool) -> None:
    positive(hw, "hardware", "nodes")
    one_of(hw.accelerator, "hardware.accelerator", ACCELERATORS)
    one_of(hw.figures, "hardware.figures", FIGURES)
    require(
        hw.figures == "profile" or hw.accelerator == "cpu",
        "hardware.figures",
        "host measures this CPU host (hardware.accelerator=cpu); a GPU's figures are its profile's",
    )
    threads = hw.threads_per_rank
    require(threads is None or threads > 0, "hardware.threads_per_rank", "must be positive or null")
    require(hw.cores is None or hw.cores > 0, "hardware.cores", "must be positive or null")
    emulated = hw.emulated_linear_ms
    require(
        emulated is None or emulated > 0, "hardware.emulated_linear_ms", "must be positive or null"
    )
    require(hw.devices is None or hw.devices > 0, "hardware.devices", "must be positive or null")
    check_slow_nodes(hw)
    if hw.accelerator == "gpu" and train:
        import torch  # only when a GPU is asked for: the CPU path stays free of heavy imports

        require(
            torch.cuda.is_available(), "hardware.accelerator", "gpu, but no CUDA device is visible"
        )


def check_slow_nodes(hw: Any) -> None:
    net, key = hw.emulate_network, "hardware.emulate_network"
    slow = list(net.slow_nodes)
    require(
        not slow or net.enabled,
        f"{key}.slow_nodes",
        f"slows emulated links: needs {key}.enabled=true",
    )
    require(
        all(0 <= n < hw.nodes for n in slow) and len(set(slow)) == len(slow),
        f"{key}.slow_nodes",
        f"distinct nodes from 0 to {hw.nodes - 1} (hardware.nodes={hw.nodes}), got {slow}",
    )
    require(
        len(slow) < hw.nodes,
        f"{key}.slow_nodes",
        "a node slower than the others: not every node",
    )
    require(
        0 < net.slow_share < 1,
        f"{key}.slow_share",
        f"the share of the rate a slow node's link gets, between 0 and 1, got {net.slow_share}",
    )


def missing(node: Any, prefix: str, *names: str) -> None:
    for name in names:
        require(
            not OmegaConf.is_missing(node, name),
            f"{prefix}.{name}",
            "missing: every hardware profile gives it (see conf/hardware/)",
        )


def fraction(value: float, key: str) -> None:
    require(0 < value <= 1, key, f"must be in (0, 1], got {value}")


def check_profile(hw: Any) -> None:
    """A hardware profile is complete and physical: the planner prices jobs with it."""
    missing(hw, "hardware", *PROFILE)
    positive(hw, "hardware", "power_w", "pue")
    fraction(hw.compute_efficiency, "hardware.compute_efficiency")
    software = ("step_overhead_s", "tp_layer_overhead_us", "ddp_overhead_us_per_mb")
    for name in ("usd_per_kwh", *software):
        require(hw[name] >= 0, f"hardware.{name}", f"must be 0 or more, got {hw[name]}")
    require(hw.memory_gib is None or hw.memory_gib > 0, "hardware.memory_gib", "must be positive")
    for dtype, tflops in hw.peak_tflops.items():
        require(tflops > 0, f"hardware.peak_tflops.{dtype}", f"must be positive, got {tflops}")
    for dtype, mib in getattr(hw, "workspace_mib", {}).items():
        require(mib >= 0, f"hardware.workspace_mib.{dtype}", f"must be 0 or more, got {mib}")
    check_gemm_curves(hw)
    for tier in ("intra_node", "inter_node"):
        link = hw[tier]
        missing(link, f"hardware.{tier}", *LINK)
        positive(link, f"hardware.{tier}", "bandwidth_gbs")
        require(link.latency_us >= 0, f"hardware.{tier}.latency_us", "must be 0 or more")
        fraction(link.efficiency, f"hardware.{tier}.efficiency")
    for dim, tier in hw.tiers.items():
        one_of(dim, "hardware.tiers", LINK_DIMS)
        one_of(tier, f"hardware.tiers.{dim}", TIERS)


def check_gemm_curves(hw: Any) -> None:
    bandwidth = hw.memory_bandwidth_gbs
    require(bandwidth is None or bandwidth > 0, "hardware.memory_bandwidth_gbs", "must be positive")
    for key, points in hw.gemm_efficiency.items():
        name = f"hardware.gemm_efficiency.{key}"
        sizes = [p[0] for p in points]
        require(
            all(len(p) == 2 and p[0] > 0 and 0 < p[1] <= 1 for p in points) and bool(points),
            name,
            "must be [size, share] points, sizes positive, shares in (0, 1]",
        )
        require(sizes == sorted(set(sizes)), name, f"sizes must rise, got {sizes}")
