"""The device mesh's shape: how many ways a job splits its data (dp), its layer stack (pp), its
sequence (cp: context parallelism) and each layer (tp); dp x pp x cp x tp = the job's processes.
Nothing here imports torch.

Ranks are numbered with tp innermost, then cp, then dp, then pp (Megatron-LM's order): tensor-
parallel ranks, which talk inside every layer, are neighbours, on one node where the job spans
several; context-parallel ones, which pass keys and values around a ring in every attention, next.
A size left null takes whatever the device count leaves for it; with `hardware.devices` null too,
the mesh alone says how many processes to start.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from omegaconf import DictConfig

from runner.errors import ConfigError, require

DIMS = ("pp", "dp", "cp", "tp")  # outermost first: the order of the mesh's dimensions
NAMES = {"dp": "data", "pp": "pipeline", "cp": "context", "tp": "tensor", "ep": "expert"}
# What traffic is counted by: the mesh's dimensions, and sequence parallelism's collectives,
# which run over the tp ranks (a dimension of its own in the figures, not of the mesh)
TRAFFIC_DIMS = ("dp", "tp", "sp", "cp", "ep", "pp")
RANKS_OF = {"sp": "tp"}  # a traffic dimension's ranks, where they are another's
# Shown in a plan only where they move bytes: the others are, with their zeros, in every plan
WHERE_USED = ("sp", "cp", "ep")
P2P_DIMS = ("cp", "pp")  # sends to a neighbour, not collectives: a byte crosses one link once
LINK_DIMS = (*DIMS, "ep")  # each may cross its own tier of links (hardware.tiers)


@dataclass(frozen=True)
class Mesh:
    pp: int = 1
    dp: int = 1
    tp: int = 1
    cp: int = 1
    # Expert parallelism's ranks, drawn from dp (ep divides it): not a dimension of the mesh, whose
    # processes it does not multiply; the ranks of an ep group hold different experts
    ep: int = 1

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (self.pp, self.dp, self.cp, self.tp)

    @property
    def world(self) -> int:
        return self.pp * self.dp * self.cp * self.tp

    def coords(self, rank: int) -> dict[str, int]:
        """This rank's index along each dimension."""
        return {
            "pp": rank // (self.dp * self.cp * self.tp),
            "dp": rank // (self.cp * self.tp) % self.dp,
            "cp": rank // self.tp % self.cp,
            "tp": rank % self.tp,
        }

    def size(self, dim: str) -> int:
        """How many ranks a traffic dimension's collectives span (sp: the tp ranks; dp: the
        replicas' and, with context parallelism, each one's cp ranks, which sum gradients too)."""
        if dim == "dp":
            return self.dp * self.cp
        return getattr(self, RANKS_OF.get(dim, dim))

    def rank(self, pp: int, dp: int, tp: int, *, cp: int = 0) -> int:
        """The global rank at these coordinates."""
        return ((pp * self.dp + dp) * self.cp + cp) * self.tp + tp

    @property
    def layout(self) -> str:
        """What the job runs as: none, data, pipeline, tensor, or a combination like data+tensor."""
        used = [NAMES[d] for d in ("dp", "pp", "cp", "ep", "tp") if getattr(self, d) > 1]
        return "+".join(used) or "none"


def mesh_of(cfg: DictConfig) -> Mesh:
    """The mesh of a resolved config (see `resolve`): every size is a number."""
    p = cfg.parallel
    return Mesh(pp=p.pp, dp=p.dp, tp=p.tp, cp=p.get("cp", 1), ep=p.get("ep", 1))


def resolve(cfg: DictConfig, started: int | None = None) -> Mesh:
    """Fill the sizes left null, and `hardware.devices` if null, so that dp x pp x cp x tp =
    devices x nodes; refuse a mesh that cannot match the processes. `started`: the processes
    torchrun or SLURM started, which a null `hardware.devices` then takes."""
    p, hw = cfg.parallel, cfg.hardware
    require(hw.devices is None or hw.devices > 0, "hardware.devices", "must be positive or null")
    if hw.devices is None and started is not None:
        require(
            started % hw.nodes == 0,
            "hardware.nodes",
            f"{started} processes were started, which do not split over {hw.nodes} nodes",
        )
        hw.devices = started // hw.nodes
    given = {d: p[d] for d in DIMS if p[d] is not None}
    for dim, size in given.items():
        require(size > 0, f"parallel.{dim}", f"must be positive or null, got {size}")
    free = [d for d in DIMS if p[d] is None]
    if len(free) > 1:
        names = " and ".join(f"parallel.{d}" for d in free)
        raise ConfigError(f"parallel.{free[-1]}", f"{names} are null: only one can take the rest")
    product = math.prod(given.values())
    if hw.devices is None:
        sizes = {**given, **dict.fromkeys(free, 1)}
        require(
            product % hw.nodes == 0,
            "hardware.nodes",
            f"the mesh's {product} processes do not split over {hw.nodes} nodes",
        )
        hw.devices = product // hw.nodes
    else:
        sizes = {**given, **{d: _rest(hw.devices * hw.nodes, product, d, given) for d in free}}
        _match(sizes, hw.devices, hw.nodes)
    for dim in DIMS:
        p[dim] = sizes[dim]
    sizes["ep"] = p.get("ep", 1)
    if p.microbatches is None:  # as many as the pipeline has stages: 1F1B's least
        p.microbatches = sizes["pp"]
    return Mesh(**sizes)


def _rest(world: int, product: int, dim: str, given: dict[str, int]) -> int:
    require(
        world % product == 0,
        "hardware.devices",
        f"{world} processes do not split into {_product(given)} for parallel.{dim}",
    )
    return world // product


def _match(sizes: dict[str, int], devices: int, nodes: int) -> None:
    world = devices * nodes
    if math.prod(sizes.values()) != world:
        raise ConfigError(
            "parallel",
            f"{' x '.join(shown_dims(sizes))} = {_product(sizes)} = {math.prod(sizes.values())} "
            f"does not equal the {world} processes of hardware.devices={devices} x "
            f"hardware.nodes={nodes}",
        )


def shown_dims(sizes: dict[str, int | None]) -> list[str]:
    """The dimensions a message names, in its order: context parallelism's where it is used."""
    return [d for d in ("dp", "pp", "cp", "tp") if d in sizes and (d != "cp" or sizes[d] != 1)]


def _product(sizes: dict[str, int]) -> str:
    return " x ".join(f"{d}={sizes[d]}" for d in shown_dims(sizes)) or "1"
