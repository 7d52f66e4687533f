"""The experiment runner. Importing it turns MLflow's usage telemetry off unless the user chose:
MLflow 3 otherwise fetches a config from, and reports to, its own servers from every process that
creates a client, and a training job sends no traffic beyond its own ranks and tracking store."""

import os

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
