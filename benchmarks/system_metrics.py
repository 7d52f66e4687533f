"""What MLflow's system metrics cost a training job (`logger.system_metrics`: MLflow's sampling
thread in each node's first rank): the runner with them on and off, 2 data-parallel processes,
in rounds as benchmarks/overhead.py runs its sides (one run each, the order turned every round,
the median of each round's ratio), sampled every second (ten times the default rate). This
machine drifts by 5-15 % over tens of seconds, more than the effect, so the ratio at equal compute
speed (each side's share of the loop spent computing, the figure the drift moves least) is judged
too, and the sampler's own CPU time per sample is timed on its own: what it can take from training
at most, without the noise.
Targets: samples/s on / off >= 0.98, raw and at equal compute speed; the sampler under 1 % of one
core at the default interval. The raw target is judged only where the same work's time moved less
than its margin between the runs (benchmarks/common.py: drift).
Usage: .venv/bin/python -m benchmarks.system_metrics [override ...]
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import drift, ratio_line, raw_target
from benchmarks.overhead import DP2, ratio, rounds, runner_run, show

ROUNDS = 7
# Sampled every second rather than every 10 s (the default): ten times the samples of a user's job
INTERVAL = "logger.system_metrics_interval_s=1"
DEFAULT_INTERVAL_S = 10.0  # logger.system_metrics_interval_s
SAMPLES = 50


def cpu_per_sample_s(folder: str) -> float:
    """The sampler's CPU time for one sample: read the host, aggregate, log it to a store."""
    from mlflow import MlflowClient
    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

    uri = f"sqlite:///{Path(folder) / 'sampler.db'}"
    client = MlflowClient(uri)
    run = client.create_run(client.create_experiment("sampler")).info.run_id
    monitor = SystemMetricsMonitor(run, sampling_interval=1, tracking_uri=uri)
    monitor.collect_metrics()  # psutil's first reading sets its baseline
    start = time.thread_time()
    for _ in range(SAMPLES):
        monitor.collect_metrics()
        monitor.publish_metrics(monitor.aggregate_metrics())
    monitor.mlflow_logger.flush()
    return (time.thread_time() - start) / SAMPLES


def main() -> None:
    extra = sys.argv[1:]
    with tempfile.TemporaryDirectory() as tmp:
        done = rounds(
            ROUNDS,
            on=lambda: runner_run(tmp, *DP2, INTERVAL, *extra),
            off=lambda: runner_run(tmp, *DP2, "logger.system_metrics=false", *extra),
        )
        sample_s = cpu_per_sample_s(tmp)
    raw, busy = ratio(done, "on", "off"), ratio(done, "on", "off", "busy")
    show("system metrics on / off, DDP 2", raw)
    show("system metrics on / off, DDP 2, equal compute speed", busy)
    moved = drift(ratio(done, "on", "off", "compute")[1])
    print(f"the same work's time between runs moved {100 * moved:.1f} % (median over rounds)")
    print(ratio_line("system metrics on / off, DDP 2", raw[0], raw_target(">= 0.98", moved)))
    print(ratio_line("system metrics on / off, DDP 2, equal compute speed", busy[0], ">= 0.98"))
    print(ratio_line("sampler's CPU a sample, ms", 1000 * sample_s, "none"))
    share = 100 * sample_s / DEFAULT_INTERVAL_S
    print(ratio_line("sampler's share of one core at 10 s, %", share, "< 1"))


if __name__ == "__main__":
    main()
