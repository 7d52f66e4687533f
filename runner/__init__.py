"""The experiment runner. Importing it turns MLflow's usage telemetry off unless the user chose:
MLflow 3 otherwise fetches a config from, and reports to, its own servers from every process that
creates a client, and a training job sends no traffic beyond its own ranks and tracking store.
It also caps the CPU math libraries' caches of compiled products (runner/launcher/kernel_cache.py),
here because they read the cap once, when torch first multiplies: any later would be too late."""

import os

from runner.launcher.kernel_cache import cap_kernel_caches

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
cap_kernel_caches()
