"""Wall time of every optimizer step, summarized after warm-up as step time and throughput."""

import time
from statistics import fmean

import pytorch_lightning as pl


class StepTimer(pl.Callback):
    def __init__(self, global_batch: int, tokens_per_sample: int, warmup_steps: int) -> None:
        self.global_batch = global_batch
        self.tokens_per_sample = tokens_per_sample
        self.warmup_steps = warmup_steps
        self.step_times: list[float] = []
        self._start = 0.0

    def on_train_batch_start(self, trainer: pl.Trainer, *_: object) -> None:
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer: pl.Trainer, *_: object) -> None:
        # In automatic optimization this hook runs after backward and the optimizer step.
        self.step_times.append(time.perf_counter() - self._start)

    def summary(self) -> dict[str, float]:
        timed = self.step_times[self.warmup_steps :]
        if not timed:
            return {}
        step = fmean(timed)
        figures = {"step_time_s": step, "throughput_samples_per_s": self.global_batch / step}
        if self.tokens_per_sample:
            figures["throughput_tokens_per_s"] = (
                figures["throughput_samples_per_s"] * self.tokens_per_sample
            )
        return figures

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.logger is not None and self.summary():
            trainer.logger.log_metrics(self.summary(), step=trainer.global_step)
