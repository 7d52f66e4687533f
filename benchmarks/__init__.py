"""Benchmarks of the runner's own cost (`make bench`)."""

import runner  # noqa: F401  (turns MLflow's telemetry off in the benchmarks' own clients too)
