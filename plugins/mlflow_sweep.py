"""A Hydra callback that opens one MLflow parent run per multirun and nests every job under it."""

from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig


class MlflowSweepCallback(Callback):
    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        from runner.cluster import global_rank

        if global_rank() != 0:  # a sweep under torchrun or srun: one parent, from rank 0
            return
        from runner.sweep_run import start_parent

        sweep = " ".join(config.hydra.overrides.task)
        start_parent(config.logger.tracking_uri, config.logger.experiment_name, f"sweep: {sweep}")

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from runner.sweep_run import end_parent

        end_parent("FINISHED")
