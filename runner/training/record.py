"""Rank 0's record of a training run: the figures, the planner's predictions, the pictures."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from omegaconf import DictConfig

from runner.data import Splits
from runner.job import Job, Resolved
from runner.launcher.cluster import world_size
from runner.layouts.pipeline import step_table
from runner.mesh import Mesh
from runner.metrics import BUBBLE_MEASURED, BUBBLE_THEORY, MFU, STEP_TIME, THROUGHPUT
from runner.planner import mfu, predict
from runner.stragglers import TAG, straggler
from runner.tracking.pictures import Span, rank_timeline
from runner.tracking.store import Run, client_of
from runner.training.sampled_profile import merged_trace


def chrome_trace(spans_by_rank: list[list[list[Span]]]) -> dict[str, Any]:
    """The timeline as Chrome's trace format: open it in chrome://tracing or ui.perfetto.dev."""
    events = [
        {
            "name": f"{kind} {label}".strip(),
            "cat": kind,
            "ph": "X",
            "ts": start * 1e6,
            "dur": (end - start) * 1e6,
            "pid": 0,
            "tid": rank,
        }
        for rank, steps in enumerate(spans_by_rank)
        for step in steps
        for kind, start, end, label in step
    ]
    names = [
        {"name": "thread_name", "ph": "M", "pid": 0, "tid": r, "args": {"name": f"rank {r}"}}
        for r in range(len(spans_by_rank))
    ]
    return {"traceEvents": names + events, "displayTimeUnit": "ms"}


def record_data(cfg: DictConfig, run_id: str, splits: Splits) -> None:
    """The data set as the run's MLflow dataset input (its UI's Datasets section): its name, its
    content's digest, its rows; two runs on other data are told apart by name or digest. A
    loader of the user's that gives no digest is not recorded as one."""
    if not splits.digest:
        return
    from mlflow.entities import Dataset, DatasetInput, InputTag
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

    loader = cfg.data._target_
    rows = {"num_rows": len(splits.train), "val_rows": len(splits.val)}
    if splits.tokens_per_sample:
        rows["tokens_per_sample"] = splits.tokens_per_sample
    data = Dataset(
        name=loader.rsplit(".", 1)[-1].removeprefix("load_"),
        digest=splits.digest,
        source_type="code",
        source=json.dumps({"loader": loader}),
        profile=json.dumps(rows),
    )
    context = [InputTag(MLFLOW_DATASET_CONTEXT, "train")]
    client_of(cfg.logger.tracking_uri).log_inputs(run_id, [DatasetInput(data, context)])


def record_training(
    cfg: DictConfig,
    r: Resolved,
    run_id: str,
    figures: dict[str, float],
    gathered: list[dict[str, Any]],
) -> None:
    run = Run(client_of(cfg.logger.tracking_uri), run_id)
    world = world_size(cfg)
    job = r.job  # None for a model of the user's: nothing predicted
    if job is not None:
        figures = figures | predict(job) | measured_mfu(job, figures)
    run.log_metrics(figures)
    slowest = straggler(figures, world, cfg.hardware.devices)
    if slowest is not None:
        run.client.set_tag(run_id, TAG, slowest.line())
    warmup, steps = cfg.trainer.warmup_steps, cfg.trainer.max_steps
    if steps <= warmup:  # a short run: nothing timed after warm-up
        print(f"note: all {steps} steps were warm-up (trainer.warmup_steps={warmup}): step time, "
              "throughput, idle, MFU and the timeline are left out", file=sys.stderr)  # fmt: skip
    traces = [rank.get("trace") for rank in gathered]
    if any(traces):
        run.client.log_dict(run_id, merged_trace(traces), "profile.trace.json")
    spans = [rank["spans"] for rank in gathered]
    if not (spans and all(spans)):
        return
    layout = f"{r.mesh.layout} parallel, {world} rank(s)"
    run.client.log_figure(
        run_id, rank_timeline(spans, f"{layout}: {len(spans[0])} steps"), "timeline.png"
    )
    run.client.log_dict(run_id, chrome_trace(spans), "timeline.trace.json")
    if r.mesh.pp > 1:
        record_pipeline(cfg, r.mesh, run, [steps[:1] for steps in spans], layout, figures)


def measured_mfu(job: Job, figures: dict[str, float]) -> dict[str, float]:
    """MFU from the measured step time; with trainer.measure=false, from the loop's interval."""
    step = figures.get(STEP_TIME.name)
    if step is None and figures.get(THROUGHPUT.name):
        step = job.batch_size / figures[THROUGHPUT.name]
    return {MFU.name: mfu(job, step)} if step else {}


def record_pipeline(
    cfg: DictConfig,
    mesh: Mesh,
    run: Run,
    one_step: list[list[list[Span]]],
    layout: str,
    figures: dict,
) -> None:
    p = cfg.parallel
    title = f"{layout}, {p.schedule}, {p.microbatches} micro-batches: one step"
    run.client.log_figure(run.run_id, rank_timeline(one_step, title), "pipeline_gantt.png")
    pipeline = [one_step[mesh.rank(s, 0, 0)][0] for s in range(mesh.pp)]  # replica 0, shard 0
    table = step_table.report(mesh.pp, p.microbatches, p.schedule, pipeline)
    run.client.log_text(run.run_id, table, "pipeline_steps.txt")
    bubble = bubble_note(figures, world_size(cfg), cfg.hardware.emulated_linear_ms)
    run.client.set_tag(run.run_id, "mlflow.note.content", f"{bubble}\n\n```\n{table}\n```")


def bubble_note(figures: dict[str, float], world: int, emulated_ms: float | None = None) -> str:
    theory, measured = figures[BUBBLE_THEORY.name], figures[BUBBLE_MEASURED.name]
    note = f"Bubble: theory {theory:.3f}, measured {measured:.3f}."
    if emulated_ms:
        note += (
            f" Each layer's work was a device's: its rank slept {emulated_ms:g} ms a forward and"
            f" {2 * emulated_ms:g} ms a backward (hardware.emulated_linear_ms), so {world} ranks"
            " kept the schedule's shape whatever the host's cores."
        )
    cores = len(os.sched_getaffinity(0))
    if measured - theory > 0.1:
        note += (
            " The measurement counts every moment a rank is not computing inside the schedule;"
            " it exceeds the theory where the micro-batches' compute is short next to the P2P"
            " latency (the theory counts compute only)"
            + (f", and here {world} ranks share {cores} cores." if world > cores else ".")
        )
    return note
