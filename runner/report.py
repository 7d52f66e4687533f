"""Rank 0's record of a training run: the figures, the planner's predictions, the timeline."""

from __future__ import annotations

from typing import Any

from mlflow import MlflowClient
from omegaconf import DictConfig

from runner.cluster import world_size
from runner.pictures import rank_timeline
from runner.planner import predict
from runner.tracking import Run


def record_training(
    cfg: DictConfig, run_id: str, figures: dict[str, float], gathered: list[dict[str, Any]]
) -> None:
    run = Run(MlflowClient(cfg.logger.tracking_uri), run_id)
    world = world_size(cfg)
    run.log_metrics(figures | predict(cfg, world))
    spans = [rank["spans"] for rank in gathered]
    if spans and all(spans):
        title = (
            f"{cfg.parallel.name} parallel, {world} rank(s): {len(spans[0])} steps after warm-up"
        )
        run.client.log_figure(run_id, rank_timeline(spans, title), "timeline.png")
