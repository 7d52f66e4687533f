"""Each layout's rules for a resolved mesh: what its size asks of the batch, the schedule and the
model's layers (the model's spec says how its layers split). Torch-free."""

from __future__ import annotations

import sys

from omegaconf import DictConfig, open_dict

from runner.choices import MULTI_STAGE, PARAM_GATHER, RESHARD, SCHEDULES, SHARDS
from runner.errors import one_of, positive, require
from runner.job import resolved_shard
from runner.mesh import Mesh
from runner.models.registry import spec_for
from runner.models.sizes import pipeline_layers, stage_layers
from runner.models.spec import ModelSpec, PlannedModel
from runner.precision import precision_of


def check_layout(cfg: DictConfig, mesh: Mesh) -> None:
    """Every rule of the layout on `mesh`, the model's spec looked up once for all of them (None:
    a model of the user's, which has none)."""
    spec = spec_for(cfg.model)
    one_of(cfg.parallel.shard, "parallel.shard", SHARDS)
    one_of(cfg.parallel.reshard_after_forward, "parallel.reshard_after_forward", RESHARD)
    one_of(cfg.parallel.param_gather, "parallel.param_gather", PARAM_GATHER)
    require(
        cfg.parallel.param_gather == "forward"
        or resolved_shard(cfg.parallel.shard, mesh.size("dp")) == "gradients",
        "parallel.param_gather",
        "step gathers the weights a distributed optimizer keeps from forward to backward "
        "(parallel.shard=optimizer or gradients, over several replicas): ZeRO-3 gathers unit "
        "by unit, DDP holds them all",
    )
    require(
        mesh.pp == 1 or cfg.parallel.reshard_after_forward != "always",
        "parallel.reshard_after_forward",
        "always frees the weights between a pipeline's micro-batches, which its stages keep "
        "(torch's pipelining): use default or never with parallel.pp > 1",
    )
    if mesh.size("dp") > 1:  # replicas, or their cp ranks, which sum gradients and shard too
        check_data(cfg, mesh)
    if mesh.pp > 1:
        check_pipeline(cfg, mesh, spec)
    elif cfg.parallel.microbatches != 1:
        check_accumulation(cfg, mesh, spec)
    if mesh.tp > 1:
        check_tensor(cfg, mesh, spec)
    if cfg.parallel.sequence_parallel:
        check_sequence(cfg, mesh, spec)
    if mesh.cp > 1:
        check_context(cfg, mesh, spec)
    if cfg.parallel.ep != 1:
        check_experts(cfg, mesh, spec)
    if spec is not None and spec.experts and cfg.mode == "train":
        require(
            cfg.trainer.precision != "16-mixed",
            "trainer.precision",
            "16-mixed scales the loss, and the balancing loss's gradient joins backward unscaled: "
            "use bf16-mixed or 32-true with a mixture of experts",
        )


def batch_for_plan(cfg: DictConfig, mesh: Mesh) -> None:
    """A plan answers for any batch: one that does not split into the replicas' micro-batches is
    planned at the next that does (training refuses it: it would change what is trained)."""
    m, batch = cfg.parallel.microbatches or 1, cfg.data.batch_size
    unit = mesh.dp * m
    if isinstance(batch, int) and batch > 0 and batch % unit:
        planned = -(-batch // unit) * unit
        print(
            f"note: data.batch_size {batch} does not split into {mesh.dp} data-parallel replicas"
            f" x {m} micro-batches: planned at {planned}",
            file=sys.stderr,
        )
        with open_dict(cfg.data):
            cfg.data.batch_size = planned


def check_data(cfg: DictConfig, mesh: Mesh) -> None:
    require(
        cfg.data.batch_size % mesh.dp == 0,
        "data.batch_size",
        f"{cfg.data.batch_size} does not split into {mesh.dp} data-parallel shards",
    )
    cap = cfg.parallel.bucket_cap_mb
    require(cap is None or cap > 0, "parallel.bucket_cap_mb", "must be positive, or null")
    if cfg.parallel.shard != "none":
        require(
            cfg.trainer.precision != "16-mixed",
            "trainer.precision",
            f"16-mixed scales the loss, and its scaler has not been run on FSDP's sharded "
            f"gradients here: use bf16-mixed with parallel.shard={cfg.parallel.shard}",
        )
        require(
            not cfg.trainer.compile,
            "trainer.compile",
            f"parallel.shard={cfg.parallel.shard} runs FSDP2's hooks eagerly here: set "
            "trainer.compile=false, or parallel.shard=none",
        )


def check_pipeline(cfg: DictConfig, mesh: Mesh, spec: ModelSpec | None) -> None:
    p = cfg.parallel
    require(has_stages(spec), "parallel.pp", "this model has no pipeline split")
    one_of(p.schedule, "parallel.schedule", SCHEDULES)
    positive(p, "parallel", "microbatches", "virtual_stages")
    check_microbatches(cfg, mesh)
    require(
        p.schedule != "1f1b" or p.microbatches >= mesh.pp,
        "parallel.microbatches",
        f"1f1b needs at least one micro-batch per stage ({mesh.pp}), got {p.microbatches}; "
        "schedule=gpipe runs any number (1 is plain model parallelism)",
    )
    rounds = max(1, p.microbatches // mesh.pp)  # interleaved schedules run micro-batches in rounds
    require(
        p.schedule not in MULTI_STAGE or p.microbatches % rounds == 0,
        "parallel.microbatches",
        f"{p.schedule} runs micro-batches in rounds of parallel.pp={mesh.pp}: {p.microbatches} "
        f"is not a multiple of its {rounds} rounds; try {rounds * mesh.pp}",
    )
    require(
        p.virtual_stages == 1 or p.schedule in MULTI_STAGE,
        "parallel.virtual_stages",
        f"{p.schedule} runs one stage per device; virtual stages need {' or '.join(MULTI_STAGE)}",
    )
    # Measured on torch 2.13: the input pass detaches a view that DTensor's split made, in place
    views = mesh.tp > 1 and (p.sequence_parallel or p.vocab_parallel and "vocab_size" in cfg.model)
    require(
        cfg.mode != "train" or p.schedule != "zero_bubble" or not views,
        "parallel.schedule",
        "zero_bubble splits backward into input and weight passes, which a vocabulary or "
        "sequence split over tp does not take here: set parallel.vocab_parallel=false and "
        "parallel.sequence_parallel=false with it, or use interleaved_1f1b",
    )
    stages, layers = mesh.pp * p.virtual_stages, pipeline_layers(cfg.model)
    require(
        stages <= layers,
        "parallel.pp",
        f"{stages} pipeline stages (parallel.pp x virtual stages) for a model of {layers} layer(s)",
    )
    if p.split is not None:
        require(
            len(p.split) == stages and min(p.split) > 0 and sum(p.split) == layers,
            "parallel.split",
            f"needs {stages} positive layer counts summing to {layers}, got {list(p.split)}",
        )


def has_stages(spec: ModelSpec | None) -> bool:
    """Whether a model's spec splits it into pipeline stages (a user's model has no spec): it
    counts more than one layer."""
    return spec is not None and type(spec).layers is not PlannedModel.layers


def check_microbatches(cfg: DictConfig, mesh: Mesh) -> None:
    m, shard = cfg.parallel.microbatches, cfg.data.batch_size // mesh.dp
    require(
        shard % m == 0,
        "parallel.microbatches",
        f"a batch of {shard} per data-parallel replica does not split into {m} micro-batches",
    )


def check_accumulation(cfg: DictConfig, mesh: Mesh, spec: ModelSpec | None) -> None:
    """Micro-batches without a pipeline: gradient accumulation, run as a one-stage pipeline's
    schedule (runner/layouts/pipeline/strategy.py)."""
    p, t = cfg.parallel, cfg.trainer
    positive(p, "parallel", "microbatches")
    check_microbatches(cfg, mesh)
    one_of(p.schedule, "parallel.schedule", SCHEDULES)
    require(
        p.schedule not in MULTI_STAGE and p.virtual_stages == 1,
        "parallel.schedule",
        f"{p.schedule} with virtual_stages={p.virtual_stages} interleaves several stages; "
        "micro-batches without a pipeline (parallel.pp=1) run one stage: use 1f1b or gpipe",
    )
    require(
        has_stages(spec),
        "parallel.microbatches",
        "gradient accumulation runs the model as a one-stage pipeline, and this model has no "
        "pipeline split: use 1",
    )
    require(
        not t.compile,
        "trainer.compile",
        "micro-batches run as a pipeline schedule, whose stage runs eagerly: set "
        "parallel.microbatches=1 to compile",
    )
    require(
        t.precision != "16-mixed",
        "trainer.precision",
        "16-mixed scales the loss, which the micro-batch schedule's backward does not take here; "
        "use bf16-mixed (no scaling needed) or 32-true",
    )


def check_tensor(cfg: DictConfig, mesh: Mesh, spec: ModelSpec | None) -> None:
    """Every split layer must split evenly: the model's spec says which layers split."""
    require(spec is not None, "parallel.tp", "this model has no tensor-parallel plan")
    spec.check_tensor(cfg.model, mesh.tp, stage_layers(cfg.model, cfg.parallel))


def check_sequence(cfg: DictConfig, mesh: Mesh, spec: ModelSpec | None) -> None:
    """Sequence parallelism splits a model's sequence over the tensor-parallel ranks."""
    key = "parallel.sequence_parallel"
    require(
        mesh.tp > 1, key, f"splits over the tensor-parallel ranks: needs tp > 1, got tp={mesh.tp}"
    )
    require(spec is not None and spec.sequence, key, "this model has no sequence to split")
    seq = cfg.data.get("seq_len") or 0
    require(seq % mesh.tp == 0, "data.seq_len", f"{seq} positions do not split into tp={mesh.tp}")


def check_context(cfg: DictConfig, mesh: Mesh, spec: ModelSpec | None) -> None:
    """Context parallelism splits every sample's sequence into 2 x cp chunks, two per rank."""
    require(
        spec is not None and spec.sequence, "parallel.cp", "this model has no sequence to split"
    )
    seq = cfg.data.get("seq_len") or 0
    require(
        seq % (2 * mesh.cp) == 0,
        "data.seq_len",
        f"{seq} positions do not split into 2 x cp = {2 * mesh.cp} equal chunks (two per "
        f"context-parallel rank, for the causal mask's balance)",
    )
    if cfg.mode == "train":
        require(
            not cfg.trainer.compile,
            "trainer.compile",
            "the ring attention sends and receives between its steps, which compiling does not "
            "trace here: set trainer.compile=false with parallel.cp",
        )


def check_experts(cfg: DictConfig, mesh: Mesh, spec: ModelSpec | None) -> None:
    """Expert parallelism places a mixture of experts' experts over ep of the dp ranks."""
    ep = cfg.parallel.ep
    require(ep > 0, "parallel.ep", f"must be positive, got {ep}")
    require(spec is not None and spec.experts, "parallel.ep", "this model has no experts")
    n = cfg.model.n_experts
    require(n % ep == 0, "model.n_experts", f"{n} experts do not split over parallel.ep={ep}")
    require(
        mesh.dp % ep == 0,
        "parallel.ep",
        f"its ranks are data-parallel ones: {ep} does not divide parallel.dp={mesh.dp}",
    )
    if cfg.mode == "train":
        masters = precision_of(cfg.trainer).masters
        require(
            cfg.checkpoint.every_n_steps == 0 or (cfg.parallel.shard == "none" and not masters),
            "checkpoint.every_n_steps",
            "snapshots of experts sharded by FSDP2 over their replicas are not written here: "
            "set 0, or parallel.shard=none with 32-true or bf16-mixed",
        )
