"""One job: validate, then train or compute a worked example, recorded in one MLflow run."""

from __future__ import annotations

from collections.abc import Mapping

from omegaconf import DictConfig

from runner.validate import validate


def run_job(
    cfg: DictConfig, choices: Mapping[str, str | None], overrides: list[str]
) -> dict[str, float]:
    validate(cfg)  # before anything heavy is imported or any run is opened
    if cfg.mode == "train":
        from runner.launch import run

        return run(cfg, choices, overrides)
    if cfg.mode == "plan":
        from runner.plan import run_plan

        return run_plan(cfg, choices, overrides)
    if cfg.mode == "report":
        from runner.compare import run_report

        return run_report(cfg, choices, overrides)
    if cfg.mode == "calibrate":
        from runner.calibrate import run_calibrate

        return run_calibrate(cfg, choices, overrides)
    from runner.tracking import recorded_run

    with recorded_run(cfg, choices, overrides) as record:
        figures = example(cfg)
        record.log_metrics(figures)
    return figures


def example(cfg: DictConfig) -> dict[str, float]:
    from hydra.utils import instantiate

    from runner.worked_examples import EXAMPLES

    return EXAMPLES[cfg.example.name](instantiate(cfg.model, _convert_="all"), cfg.example)
