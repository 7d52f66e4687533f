"""The layouts a search tries, and the rules' verdict on each.

A layout is the mesh (dp x pp x cp x tp on a node count, ep of the dp ranks), the micro-batches,
the schedule and its virtual stages, the sharding level, recomputation and sequence parallelism.
Choices that make no difference are not multiplied out: one schedule without a pipeline, no
sharding level without replicas, ZeRO-1 or ZeRO-2 (one runs as the other), sequence parallelism
only with tp > 1, virtual stages only for the schedules that interleave them, no context
parallelism by default where the attention kernel is the math path. Each layout is
checked by the very rules a run or a plan meets (runner/layouts/rules.py and the trainer's), on a
plain copy of the config: a refusal is counted under the key it names, with its first message.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from runner.choices import MULTI_STAGE
from runner.config.search import SearchConfig
from runner.config.trainer import check_attention, check_precision, check_recompute
from runner.errors import ConfigError, require
from runner.job import resolved_shard
from runner.layouts.rules import check_layout
from runner.mesh import Mesh


@dataclass(frozen=True)
class Layout:
    nodes: int
    dp: int
    pp: int
    cp: int
    tp: int
    ep: int
    microbatches: int
    schedule: str
    virtual_stages: int
    shard: str
    recompute: str
    sequence_parallel: bool

    @property
    def frame(self) -> tuple[Any, ...]:
        """Everything but the recomputation: what the layout rules read."""
        return (self.nodes, self.dp, self.pp, self.cp, self.tp, self.ep, self.microbatches,
                self.schedule, self.virtual_stages, self.shard, self.sequence_parallel)  # fmt: skip

    @property
    def mesh(self) -> Mesh:
        return Mesh(pp=self.pp, dp=self.dp, tp=self.tp, cp=self.cp, ep=self.ep)

    @property
    def parallel(self) -> dict[str, Any]:
        """The parallel group's keys this layout sets."""
        keys = ("dp", "pp", "cp", "tp", "ep", "microbatches", "schedule", "virtual_stages")
        return {k: getattr(self, k) for k in (*keys, "shard", "sequence_parallel")}

    def overrides(self) -> list[str]:
        """The command line's keys that plan or train this layout."""
        return [
            f"hardware.nodes={self.nodes}",
            *(f"parallel.{k}={str(v).lower() if isinstance(v, bool) else v}"
              for k, v in self.parallel.items()),
            f"trainer.recompute={self.recompute}",
        ]  # fmt: skip

    def words(self) -> str:
        """dp 8 x pp 4 x tp 8, 16 micro-batches, 1f1b, ZeRO-1, selective: as a person says it."""
        mesh = " x ".join(f"{d} {getattr(self, d)}" for d in ("dp", "pp", "cp", "tp", "ep")
                          if getattr(self, d) > 1) or "one device"  # fmt: skip
        parts = [mesh + (" + sp" if self.sequence_parallel else "")]
        parts.append(f"{self.microbatches} micro-batch{'es' * (self.microbatches > 1)}")
        if self.pp > 1:
            interleaved = f" v{self.virtual_stages}" if self.virtual_stages > 1 else ""
            parts.append(self.schedule + interleaved)
        if self.shard != "none":
            parts.append(f"shard {self.shard}")
        if self.recompute != "none":
            parts.append(f"recompute {self.recompute}")
        return ", ".join(parts)


class View(dict):
    """A config as plain containers, read as the rules read a DictConfig (`cfg.parallel.tp`):
    its mappings are Views too, made once."""

    def __init__(self, plain: Mapping[str, Any]) -> None:
        super().__init__(
            (k, View(v) if isinstance(v, dict) and not isinstance(v, View) else v)
            for k, v in plain.items()
        )

    def but(self, **changes: Any) -> View:
        """A copy with these keys changed, its other values shared."""
        out = View.__new__(View)
        dict.update(out, self)
        dict.update(out, changes)
        return out

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


@dataclass
class Refusals:
    """Layouts the rules refused: how many under each key, and the first message of each."""

    counts: dict[str, int]
    first: dict[str, str]

    def add(self, error: ConfigError) -> None:
        self.counts[error.key] = self.counts.get(error.key, 0) + 1
        self.first.setdefault(error.key, str(error))

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def sizes(given: list[int] | None, default: list[int], room: int) -> list[int]:
    """The values a dimension tries where `room` devices are left: a given list's that divide
    it, or the default's."""
    return [v for v in (given if given is not None else default) if room % v == 0]


def schedules(s: SearchConfig, pp: int) -> Iterator[tuple[str, int]]:
    """(schedule, virtual stages) pairs: one schedule without a pipeline, virtual stages for the
    interleaving ones only (and at least 2 there, where they differ from 1f1b)."""
    if pp == 1:
        yield ("1f1b" if "1f1b" in s.schedule else s.schedule[0]), 1
        return
    for schedule in s.schedule:
        if schedule in MULTI_STAGE:
            yield from ((schedule, v) for v in s.virtual_stages if v > 1)
        else:
            yield schedule, 1


def meshes(
    s: SearchConfig, hw: Mapping[str, Any], model: Any, ring: bool = True
) -> Iterator[tuple[int, Mesh]]:
    """Every (nodes, mesh) whose dp x pp x cp x tp fills the nodes' devices. Without `ring` (the
    math attention kernel: trainer.attention=math, which a cp rank cannot run) the default grid
    tries no context parallelism: every such mesh would be refused, and they were 57-90 % of
    Megatron-LM's Table 1 searches. A cp the user lists is still tried, and refused by name."""
    for nodes in s.nodes or [hw["nodes"]]:
        world = nodes * hw["devices"]
        for tp in sizes(s.tp, divisors(hw["devices"]), world):
            for pp in sizes(s.pp, divisors(world // tp), world // tp):
                rest = world // (tp * pp)
                cps = sizes(s.cp, divisors(rest) if ring else [1], rest) if model.sequence else [1]
                for cp in cps:
                    dp = rest // cp
                    eps = sizes(s.ep, divisors(dp), dp) if model.experts else [1]
                    for ep in eps:
                        yield nodes, Mesh(pp=pp, dp=dp, tp=tp, cp=cp, ep=ep)


def layouts(
    s: SearchConfig, hw: Mapping[str, Any], model: Any, batch: int, ring: bool = True
) -> Iterator[Layout]:
    """Every layout of the grid, the rules not yet asked. Micro-batches come from the micro-batch
    sizes (samples per micro-batch on a replica) that divide a replica's share of the batch; a
    size that does not is tried at the share itself, once."""
    for nodes, mesh in meshes(s, hw, model, ring):
        share = batch // mesh.dp if batch % mesh.dp == 0 else 0
        counts = (
            sorted({share // b if share % b == 0 else 1 for b in s.micro_batch_size})
            if share
            else [1]
        )
        shards = distinct_shards(s.shard) if mesh.size("dp") > 1 else ["none"]
        seq = s.sequence_parallel if mesh.tp > 1 and model.sequence else [False]
        for m, (schedule, v), shard, recompute, sp in itertools.product(
            counts, schedules(s, mesh.pp), shards, s.recompute, seq
        ):
            yield Layout(nodes, mesh.dp, mesh.pp, mesh.cp, mesh.tp, mesh.ep, m, schedule, v,
                         shard, recompute, sp)  # fmt: skip


def distinct_shards(named: list[str]) -> list[str]:
    """The levels that run differently, each under the first name given (ZeRO-1 runs as ZeRO-2:
    runner/job.py)."""
    first: dict[str, str] = {}
    for shard in named:
        first.setdefault(resolved_shard(shard, 2), shard)
    return list(first.values())


def verdicts(
    candidates: Iterable[Layout], base: View
) -> Iterator[tuple[Layout, ConfigError | None]]:
    """Each layout with what the rules say of it (None: it passes), on the plain config `base`.
    The layout rules read no trainer.recompute: they are asked once for the layouts that differ
    in it alone, the recomputation's own rule once for each."""
    asked: dict[tuple[Any, ...], ConfigError | None] = {}
    for layout in candidates:
        frame = layout.frame
        if frame not in asked:
            asked[frame] = refusal(dataclasses.replace(layout, recompute="none"), base)
        found = asked[frame]
        if found is None:
            try:
                check_recompute(View({"recompute": layout.recompute}), layout.schedule, layout.mesh)
            except ConfigError as error:
                found = error
        yield layout, found


def refusal(layout: Layout, base: View) -> ConfigError | None:
    """What the layout rules say of a layout (None: it passes), its recomputation aside."""
    cfg = base.but(
        parallel=base.parallel.but(**layout.parallel),
        hardware=base.hardware.but(nodes=layout.nodes),
    )
    mesh = layout.mesh
    try:
        require(
            cfg.data.batch_size % (mesh.dp * layout.microbatches) == 0,
            "data.batch_size",
            f"{cfg.data.batch_size} does not split into {mesh.dp} replicas x "
            f"{layout.microbatches} micro-batches",
        )
        check_layout(cfg, mesh)
        check_precision(cfg.trainer, cfg.hardware, mesh, False)
        check_attention(cfg.trainer, mesh)
    except ConfigError as error:
        return error
    return None
