"""MLflow's own system metrics (CPU, memory, disk, network; GPU utilization and memory where
pynvml finds an NVIDIA GPU) while a job trains: one series per node, sampled by MLflow's
SystemMetricsMonitor in a thread of the node's first rank. On one node the names are MLflow's own
(`system/cpu_utilization_percentage`); on several, each node's are `system/node_<n>/...`
(MLflow's node id), and the run id reaches the other nodes' first ranks from rank 0.
`logger.system_metrics=false` turns them off; `benchmarks/system_metrics.py` measures their cost.
"""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl


def node_id(trainer: pl.Trainer) -> str | None:
    return f"node_{trainer.node_rank}" if trainer.num_nodes > 1 else None


class SystemMetrics(pl.Callback):
    def __init__(self, run_id: str | None, tracking_uri: str, interval_s: float) -> None:
        self.run_id, self.tracking_uri, self.interval_s = run_id, tracking_uri, interval_s
        self.monitor: Any = None

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        run_id = self.run_id
        if trainer.num_nodes > 1:  # only rank 0 was handed the run
            run_id = trainer.strategy.broadcast(run_id, src=0)
        if run_id is None or trainer.local_rank != 0:
            return
        # Here, not at the top: a rank that samples nothing imports no MLflow (seconds, under
        # torchrun or srun, where ranks are not forked from a server that has it)
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        self.monitor = SystemMetricsMonitor(
            run_id,
            sampling_interval=self.interval_s,
            node_id=node_id(trainer),
            tracking_uri=self.tracking_uri,
        )
        self.monitor.start()

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.monitor is not None:
            self.monitor.finish()
            # MLflow logs a sample at each interval's end and drops the part-interval it stops
            # in: logged here, so that a run shorter than one interval has its sample too
            last = self.monitor.aggregate_metrics()
            if last:
                self.monitor.publish_metrics(last)
                self.monitor.mlflow_logger.flush()
            self.monitor = None

    # No on_exception: a failed fit's losses are written after the callbacks' hooks, and a rank
    # that another's failure ends has a moment for it (the launcher's SIGTERM follows). MLflow's
    # thread ends itself once the run is no longer RUNNING, a daemon that holds nothing up.
