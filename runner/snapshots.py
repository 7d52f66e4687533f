"""Snapshots of the whole training state, and resuming from them, on the same layout or another.

Every `checkpoint.every_n_steps` steps each rank writes its share with torch.distributed.checkpoint
(tensor-parallel shards, a rank's experts and pipeline stages stay where they are: one file per
rank): the model and the optimizer state, each tensor under its parameter's name in the whole
model (as one process holds it), shards as the DTensors they are parts of; and each rank's RNG.
DCP reads such a snapshot back into any layout of the same model: other shards, other stages,
another placement of the experts, one process. Writes go to `step_N.partial/`; once every rank
is done, rank 0 adds `runner.json` (step, model, layout) and renames the folder to `step_N/`: a
crash while writing never leaves a folder that looks complete.

Resumed on its own layout, a snapshot continues its MLflow run, RNG states and all (a requeued
job). On another, it starts a new run tagged `resumed_from`, whose params are its own layout's;
the RNG starts from the seed (which dropout draws a rank makes depends on its layout anyway).
Before loading, the snapshot's metadata (a pickle, as DCP writes it) is read with an unpickler
that admits only torch's and the checkpoint format's own classes: nothing in a file runs code.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytorch_lightning as pl
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from omegaconf import DictConfig, OmegaConf
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.tensor import DTensor

from runner.errors import ConfigError, require
from runner.launcher.preemption import Preempted
from runner.layouts.layout import layout_of
from runner.mesh import mesh_of

MARK = "runner.json"
# The format whose tensors are keyed by the whole model's names; snapshots written before it kept
# pipeline stages and ZeRO-1's shares (torch's ZeroRedundancyOptimizer's, as ZeRO-1 ran then)
# under keys of their own, read by their own layout alone.
BY_NAME = 2
# The optimizer's state one entry per parameter (`state.<name>.exp_avg`, `param_groups.<name>.lr`):
# a layout holding other parameters, or other parts of them, finds each of its own.
OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)


def shown_as(key: str, value: Any) -> str:
    """A mesh as dp/pp/cp/tp sizes (it is kept as [pp, dp, cp, tp]); anything else as it is."""
    if key == "mesh" and isinstance(value, list) and len(value) == 4:
        pp, dp, cp, tp = value
        return f"dp={dp} x pp={pp}{f' x cp={cp}' if cp > 1 else ''} x tp={tp}"
    return str(value)


def identity(cfg: DictConfig) -> dict[str, Any]:
    """What a snapshot is of: the model, which a resume must match, and the layout (the parallel
    group, resolved), which a resume on the same one continues in the same run, and on another
    starts a new run; its mesh, to name it."""
    return {
        "model": OmegaConf.to_container(cfg.model, resolve=True),
        "parallel": OmegaConf.to_container(cfg.parallel, resolve=True),
        "mesh": list(mesh_of(cfg).shape),
    }


@contextlib.contextmanager
def shards_as_dtensors(trainer: pl.Trainer) -> Iterator[None]:
    """Data parallelism over tensor-parallel shards: torch's DDP holds every shard as a plain local
    tensor (the layout's `local_shards`), and after the first forward the module lists none of them.
    While a snapshot is written or read, module and optimizer see each shard as a DTensor parameter
    over the same storage, as they do without DDP; then everything is put back, loaded values and
    optimizer state included."""
    optimizer, swaps = trainer.optimizers[0], []
    for held in layout_of(trainer.strategy).local_shards():
        owner, attr, local, spec = held.owner, held.attr, held.param, held.spec
        shard = nn.Parameter(as_dtensor(local.detach(), spec), requires_grad=local.requires_grad)
        swaps.append((owner, attr, getattr(owner, attr), local, shard))
        swap(owner, attr, optimizer, local, shard, lambda v, spec=spec: as_dtensor(v, spec))
    try:
        yield
    finally:
        for owner, attr, before, local, shard in swaps:
            swap(owner, attr, optimizer, shard, local, to_local, put_back=before)


def as_dtensor(local: torch.Tensor, spec: Any) -> DTensor:
    return DTensor.from_local(
        local, spec.mesh, spec.placements, run_check=False, shape=spec.shape, stride=spec.stride
    )


def to_local(value: torch.Tensor) -> torch.Tensor:
    return value.to_local() if isinstance(value, DTensor) else value


def swap(
    owner: nn.Module,
    attr: str,
    optimizer: torch.optim.Optimizer,
    old: torch.Tensor,
    new: torch.Tensor,
    convert: Any,
    put_back: Any = None,
) -> None:
    """Replace one parameter in its module and the optimizer (state converted likewise)."""
    delattr(owner, attr)
    setattr(owner, attr, new if put_back is None else put_back)
    for group in optimizer.param_groups:
        group["params"] = [new if p is old else p for p in group["params"]]
    if old in optimizer.state:
        state = optimizer.state.pop(old)
        optimizer.state[new] = {
            k: convert(v) if torch.is_tensor(v) and v.dim() else v for k, v in state.items()
        }


def training_state(trainer: pl.Trainer) -> tuple[nn.Module, dict[str, Any]]:
    """The module whose state is kept, and the state: the model's and this rank's optimizer's,
    under the whole model's names (runner/layouts/layout.py)."""
    view = layout_of(trainer.strategy).state_module(trainer.lightning_module.model)
    model, optim = get_state_dict(view, trainer.optimizers[0], options=OPTIONS)
    return view, {"model": model, "optim": optim}


def rng_state() -> dict[str, Any]:
    """This process's generators: the CPU's and, once CUDA is in use, every device's (dropout on
    a GPU draws from the device's generator, not the CPU's). An uninitialized CUDA is left alone:
    asking it would start it in a process that never used it."""
    state: dict[str, Any] = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Put back what rng_state() took. A snapshot from before CUDA states were kept, or from a
    run without CUDA, has none: the CPU's alone is restored."""
    torch.set_rng_state(state["cpu"])
    cuda = state.get("cuda")
    if cuda and torch.cuda.is_available():
        # Devices past this host's count have nowhere to go (set_rng_state_all would fail).
        torch.cuda.set_rng_state_all(cuda[: torch.cuda.device_count()])


def rng_entries(rank: int, state: dict[str, Any]) -> dict[str, torch.Tensor]:
    """rng_state() as DCP entries, one tensor each: the CPU's keeps the key snapshots always had
    (older ones stay readable), each device's gets its own, as DCP stores tensors, not lists."""
    cuda = {f"rng_cuda/{rank}/{i}": s for i, s in enumerate(state.get("cuda", []))}
    return {f"rng/{rank}": state["cpu"]} | cuda


def stored_rng(folder: Path, rank: int) -> dict[str, torch.Tensor]:
    """Empty tensors for the generator states `folder` holds for `rank`, for dcp.load to fill:
    which devices there are is the snapshot's, not this process's (CUDA may not be started yet,
    and an older snapshot has none)."""
    stored = dcp.FileSystemReader(str(folder)).read_metadata().state_dict_metadata
    mine = (k for k in stored if k == f"rng/{rank}" or k.startswith(f"rng_cuda/{rank}/"))
    return {k: torch.empty(stored[k].size, dtype=stored[k].properties.dtype) for k in mine}


def rng_of(rank: int, entries: dict[str, torch.Tensor]) -> dict[str, Any]:
    prefix = f"rng_cuda/{rank}/"
    devices = sorted(int(k.removeprefix(prefix)) for k in entries if k.startswith(prefix))
    state: dict[str, Any] = {"cpu": entries[f"rng/{rank}"]}
    if devices:
        state["cuda"] = [entries[f"{prefix}{i}"] for i in devices]
    return state


def barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def save(trainer: pl.Trainer, folder: Path, meta: dict[str, Any], disk_full: bool = False) -> None:
    partial = folder.with_name(folder.name + ".partial")
    with shards_as_dtensors(trainer):
        _, state = training_state(trainer)
        state.update(rng_entries(trainer.global_rank, rng_state()))
        dcp.save(state, checkpoint_id=str(partial))
    if disk_full:  # fault.disk_full_at_step: the write fails as a full disk makes it fail
        raise OSError(errno.ENOSPC, f"No space left on device while writing {partial}")
    barrier()  # every rank's share is on disk
    if trainer.global_rank == 0:
        (partial / MARK).write_text(json.dumps(meta))
        os.replace(partial, folder)
    barrier()


def load(trainer: pl.Trainer, folder: Path, own_layout: bool) -> None:
    """The snapshot's state into this rank's; its RNG states too, on the layout that wrote them."""
    rank = trainer.global_rank
    rng = stored_rng(folder, rank) if own_layout else {}
    with shards_as_dtensors(trainer):
        view, state = training_state(trainer)
        state.update(rng)  # loaded in place: `rng` holds the states afterwards
        dcp.load(state, checkpoint_id=str(folder))
        set_state_dict(
            view,
            trainer.optimizers[0],
            model_state_dict=state["model"],
            optim_state_dict=state["optim"],
            options=OPTIONS,
        )
    if own_layout:
        set_rng_state(rng_of(rank, rng))


class Snapshots(pl.Callback):
    def __init__(self, cfg: DictConfig, run_dir: Path | None, start: int, resume: Path | None):
        self.every, self.run_dir, self.start, self.resume = (
            cfg.checkpoint.every_n_steps, run_dir, start, resume,
        )  # fmt: skip
        self.meta = identity(cfg)
        self.disk_full_at = cfg.fault.disk_full_at_step if not start else None
        # A write that failed, or a stop asked for: raised at the next hook
        self.failed: OSError | Preempted | None = None

    def on_train_start(self, trainer: pl.Trainer, *_: Any) -> None:
        if dist.is_available() and dist.is_initialized():
            # Under torchrun or SLURM only rank 0 knows the run it opened: all write beside it.
            shared = [self.run_dir]
            dist.broadcast_object_list(shared, src=0)
            self.run_dir = shared[0]
        if self.resume is not None:
            load(trainer, self.resume, same_layout(written(self.resume), self.meta))

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, *_: Any
    ) -> None:
        step = self.start + trainer.global_step
        stop = pl_module.stop_agreed is not None and bool(pl_module.stop_agreed > 0)
        if self.run_dir is not None and (stop or self.every and step % self.every == 0):
            full = step == self.disk_full_at and trainer.global_rank == 0
            try:
                meta = self.meta | {"step": step, "format": BY_NAME}
                save(trainer, self.run_dir / f"step_{step:08d}", meta, full)
            except OSError as error:
                # Raised once Lightning has logged the step's figures (after this hook): the
                # run keeps the loss of the step whose snapshot failed.
                self.failed = error
        # asked to stop (runner/launcher/preemption.py): now, so written
        if stop and self.failed is None:
            self.failed = Preempted(step)

    def on_train_batch_start(self, *_: Any) -> None:
        self.raise_failed()

    def on_train_end(self, *_: Any) -> None:
        self.raise_failed()

    def raise_failed(self) -> None:
        if self.failed is not None:
            failed, self.failed = self.failed, None
            raise failed


# --- finding and checking a snapshot, before anything is launched ---
# What DCP's metadata pickle may name: its own record classes, shapes, dtypes, and these.
PLAIN = {("torch", "Size"), ("pathlib", "PosixPath"), ("torch.serialization", "_get_layout")}


class SafeUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        own = module.startswith("torch.distributed.checkpoint")
        found = (
            super().find_class(module, name)
            if own or module == "torch" or ((module, name) in PLAIN)
            else None
        )
        if (module, name) in PLAIN or (own and isinstance(found, type)):
            return found
        if isinstance(found, torch.dtype):
            return found
        raise pickle.UnpicklingError(f"{module}.{name} is not one of the format's plain types")


def check_files(folder: Path) -> None:
    """The metadata is plain data, and every file it points to holds the bytes it says."""
    try:
        meta = SafeUnpickler(io.BytesIO((folder / ".metadata").read_bytes())).load()
        for info in meta.storage_data.values():
            path = folder / info.relative_path
            if path.stat().st_size < info.offset + info.length:
                raise OSError(f"{path.name} is truncated")
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError) as failure:
        raise ValueError(str(failure)) from None


def complete(run_dir: Path) -> list[Path]:
    """The run's snapshots that were finished (rank 0 marks them last), oldest first."""
    done = (p for p in run_dir.glob("step_*") if not p.name.endswith(".partial"))
    return sorted(p for p in done if (p / MARK).is_file())


def candidates(cfg: DictConfig) -> list[Path]:
    """resume=auto: every run's; resume=<run id>: that run's; resume=<run id>/step_N: that one."""
    root = Path(cfg.checkpoint.dir)
    if cfg.resume == "auto":
        found = [s for run in root.glob("*") if run.is_dir() for s in complete(run)]
        return sorted(found, key=lambda p: (p / MARK).stat().st_mtime)
    named = root / cfg.resume
    return [named] if named.name.startswith("step_") else complete(named)


class Found(NamedTuple):
    run_id: str | None  # the run a resume continues; None: written on another layout, a new run
    folder: Path
    step: int
    origin: str  # `<run id>/step_N`: what a new run is tagged as resumed from


def written(folder: Path) -> dict[str, Any]:
    """What rank 0 noted of a snapshot: its step, model, layout and format."""
    return json.loads((folder / MARK).read_text())


def same_layout(meta: dict[str, Any], mine: dict[str, Any]) -> bool:
    return meta.get("parallel") == mine["parallel"]


def own(meta: dict[str, Any], mine: dict[str, Any]) -> bool:
    """A snapshot of this job's model on this job's layout, in the format this runner reads."""
    return meta.get("model") == mine["model"] and same_layout(meta, mine) and readable(meta)


def readable(meta: dict[str, Any]) -> bool:
    return meta.get("format") == BY_NAME


def continues(cfg: DictConfig, folder: Path) -> bool:
    """Whether resuming `folder` continues its own run (the same layout) or starts a new one."""
    return same_layout(written(folder), identity(cfg))


def layout_shown(meta: dict[str, Any]) -> str:
    parallel = meta["parallel"]
    experts = f" x ep={parallel['ep']}" if parallel.get("ep", 1) > 1 else ""
    shard = (
        f", parallel.shard={parallel['shard']}" if parallel.get("shard", "none") != "none" else ""
    )
    return shown_as("mesh", meta["mesh"]) + experts + shard


def moved(found: Found, cfg: DictConfig) -> str:
    """What a resume on another layout says it does."""
    before, now = layout_shown(written(found.folder)), layout_shown(identity(cfg))
    return (
        f"resume: {found.origin} was written on {before}, this job runs {now}: a new run from "
        f"its step {found.step}, weights and optimizer state read by name"
    )


def find(cfg: DictConfig) -> Found | None:
    """The snapshot to resume: of those `resume` names, the newest of this job's layout, else the
    newest; refused, in one line, if it is broken (the previous complete one is offered), holds
    another model or was written before snapshots were keyed by name. None: resume=auto and no
    snapshot yet, so that one batch script serves a job's first start and its requeues."""
    found, mine = [p for p in candidates(cfg) if (p / MARK).is_file()], identity(cfg)
    if not found and cfg.resume == "auto":
        return None
    if not found:
        raise ConfigError(
            "resume", f"no complete snapshot for resume={cfg.resume} under {cfg.checkpoint.dir}"
        )
    # A requeued job continues its own: this model's on this layout, where there is one; else
    # the newest of this model that this runner reads, on another layout (a new run)
    marks = {p: written(p) for p in found}  # each snapshot's runner.json, read once
    same_model = [p for p in found if marks[p].get("model") == mine["model"]]
    others = [p for p in same_model if readable(marks[p])]
    found = [p for p in found if own(marks[p], mine)] or others or same_model or found
    folder = found[-1]
    try:
        check_files(folder)
    except ValueError as broken:
        previous = (
            f"; the previous one: resume={found[-2].parent.name}/{found[-2].name}"
            if len(found) > 1
            else ""
        )
        raise ConfigError("resume", f"{folder} is broken ({broken}){previous}") from None
    meta = marks[folder]
    if meta.get("model") != mine["model"]:
        shown = [shown_as("model", meta.get("model")), shown_as("model", mine["model"])]
        raise ConfigError(
            "resume", f"{folder} holds another model: {shown[0]}, this job has {shown[1]}"
        )
    require(
        readable(meta),
        "resume",
        f"{folder} was written by an earlier runner, which keyed stages and shares by position: "
        "resume it with that runner's version, or start afresh",
    )
    require(
        meta["step"] < cfg.trainer.max_steps,
        "trainer.max_steps",
        f"{folder} is at step {meta['step']}: nothing left to train",
    )
    continued = folder.parent.name if same_layout(meta, mine) else None
    return Found(continued, folder, meta["step"], f"{folder.parent.name}/{folder.name}")
