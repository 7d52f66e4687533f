"""A job's MLflow run: opened (or reopened, for a resumed snapshot) before the job starts, ended
FINISHED only when the job returned; any exception, Ctrl-C included, ends it FAILED and keeps
whatever was logged before. Every run ends with its summary (runner/tracking/summary.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping

from mlflow import MlflowClient
from mlflow.entities import Param, RunTag
from mlflow.exceptions import MlflowException
from mlflow.utils.mlflow_tags import MLFLOW_RUN_NOTE
from omegaconf import DictConfig, OmegaConf

from runner.launcher.preemption import Preempted, requeue, requeued, slurm_job
from runner.mesh import mesh_of
from runner.tracking.store import (
    OWNER_TAG,
    RESUMED_FROM,
    Run,
    as_metrics,
    description,
    earlier_failure,
    flatten,
    open_experiment,
    owner,
    run_name,
    run_tags,
    source_tags,
)
from runner.tracking.summary import print_run_summary


@contextlib.contextmanager
def recorded_run(
    cfg: DictConfig,
    choices: Mapping[str, str | None],
    overrides: list[str],
    world_size: int = 1,
    resumed: str | None = None,
    origin: str | None = None,
    params: Mapping[str, str] | None = None,
    metrics: Mapping[str, float] | None = None,
    extra_tags: Mapping[str, str] | None = None,
) -> Iterator[Run]:
    """Open the job's run (or reopen `resumed`, a run that a snapshot continues; a new run that
    starts from another layout's snapshot is tagged with its `origin`; `params`: logged beside the
    config's) and end it FINISHED if the body returns, FAILED on any exception (Ctrl-C too) or if
    recording the config itself fails: never left RUNNING. `metrics` and `extra_tags`: what the
    job knew before its run opened (a plan's figures), recorded with the run's own tags and
    params: each of MLflow's calls is a write of the store, and a sweep of plans opens a run a
    job."""
    exp_name = cfg.logger.experiment_name
    client, exp = open_experiment(cfg.logger.tracking_uri, exp_name)
    known = as_metrics(metrics or {})
    if resumed:
        client.update_run(resumed, status="RUNNING")
        client.set_tag(resumed, OWNER_TAG, owner())
        earlier_failure(client, resumed)
        run = Run(client, resumed)
    else:
        name = cfg.logger.run_name or run_name(choices, mesh_of(cfg).layout, overrides)
        note = {MLFLOW_RUN_NOTE: description(cfg, choices, world_size)}
        tags = run_tags(cfg, choices, world_size) | source_tags() | note | {OWNER_TAG: owner()}
        tags |= {RESUMED_FROM: origin} if origin else {}
        tags |= extra_tags or {}
        run = Run(client, client.create_run(exp, run_name=name, tags=tags).info.run_id)
    try:
        if not resumed:
            logged = flatten(cfg) | dict(params or {})  # and what the job made (its network)
            run.log_together(params=[Param(k, v) for k, v in logged.items()], metrics=known)
            client.log_text(run.run_id, OmegaConf.to_yaml(cfg, resolve=True), "config.yaml")
            client.log_text(
                run.run_id, OmegaConf.to_yaml(OmegaConf.create(overrides)), "overrides.yaml"
            )
        else:
            marks = [RunTag(k, v) for k, v in (extra_tags or {}).items()]
            run.log_together(metrics=known, tags=marks)
        yield run
    except Preempted as stopped:  # asked to stop, its snapshot written: resumable, not failed
        client.set_tag(run.run_id, "preempted_at_step", str(stopped.step))
        run.end("KILLED")  # first: SLURM ends the job's processes as it requeues the job
        job = slurm_job()
        if job is not None:  # tagged before asking, for the same reason; corrected if refused
            client.set_tag(run.run_id, "requeue", requeued(job))
            refused = requeue(job)
            if refused:
                client.set_tag(run.run_id, "requeue", refused)
        summarize(client, run.run_id, cfg.logger.tracking_uri)
        raise
    except BaseException:
        run.end("FAILED")
        summarize(client, run.run_id, cfg.logger.tracking_uri)
        raise
    run.end("FINISHED")
    # A run made here is in the experiment opened by its name
    summarize(client, run.run_id, cfg.logger.tracking_uri, None if resumed else exp_name)


def summarize(
    client: MlflowClient, run_id: str, tracking_uri: str, experiment: str | None = None
) -> None:
    with contextlib.suppress(MlflowException):  # a store that failed the run: its error speaks
        print_run_summary(client, run_id, tracking_uri, experiment)
