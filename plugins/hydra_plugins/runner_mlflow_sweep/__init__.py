"""A Hydra callback that opens one MLflow parent run per multirun and nests every job under it."""

from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig


class MlflowSweepCallback(Callback):
    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        from runner.cli import fail
        from runner.config.study import check_study
        from runner.errors import ConfigError
        from runner.launcher.cluster import global_rank

        try:
            check_study(config.study, config)  # a misspelt study fails before its first job
        except ConfigError as error:
            fail(str(error))  # SystemExit: Hydra turns a callback's exception into a warning
        if global_rank() != 0:  # a sweep under torchrun or srun: one parent, from rank 0
            return
        if config.hardware.figures == "host" and config.hardware.accelerator == "cpu":
            # Before the first job, at the sweep's own settings (not its first point's batch):
            # every job is then priced by the same calibration of this host.
            from runner.modes.calibrate.host import ensure

            try:
                ensure(config, config.hydra.runtime.choices)
            except ConfigError as error:
                fail(str(error))
        from runner.tracking.sweep_run import start_parent

        sweep = " ".join(config.hydra.overrides.task)
        name = f"sweep: {sweep}"
        start_parent(config.logger.tracking_uri, config.logger.experiment_name, name, config.study)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from runner.tracking.sweep_run import end_parent

        end_parent("FINISHED")
