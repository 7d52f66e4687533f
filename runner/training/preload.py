"""What every rank imports, imported once in the fork server that forks the ranks
(runner/launcher/launch.py) rather than again in each rank: torch, Lightning, the layouts'
strategies, the runner's models (by the registry, so this module names none), the data sets'
readers, and what rank 0 records with (MLflow's store, matplotlib's image writers). Measured on a
data-parallel job of 2 ranks: 1.7 s of each job's rank 0 went to imports the server had not made
(scikit-learn, the email package that looking up a package's version loads, the SQLite dialect,
PIL's image plugins). Importing this module does it.

The collector is paused while the server imports (runner/launcher/collector.py says why). Then every
object made so far is frozen out of its sight (gc.freeze, as
Python's gc docs advise before forking): a rank's first full collection would otherwise walk the
server's millions of objects, writing to each one's header and so copying its memory page into
the rank. Measured on a data-parallel FFNN job of 2 ranks, 4 steps, run again in one process:
3.2 s a job before, 1.8 s after; each rank's first `self.log` had taken 0.75 s of it."""

from __future__ import annotations

import importlib
import pkgutil

from runner.launcher import collector
from runner.models.registry import SPECS

MODULES = (
    "runner.training.rank",
    "runner.training.record",
    "runner.layouts.data.strategy",
    "runner.layouts.mesh_strategy",
    "runner.layouts.pipeline.strategy",
    "runner.data.tabular",
    "runner.data.text",
    "sklearn.datasets",  # the tabular data sets' reader, imported when one is loaded
    "tokenizers",  # the text's, likewise
    "pydoc_data.topics",  # the text itself
    "importlib_metadata",  # Lightning looks up MLflow's version: the email package it loads
    "email.policy",
    "mlflow.store.tracking.sqlalchemy_store",
    "mlflow.store.tracking.sqlalchemy_workspace_store",
    "mlflow.tracing.processor.otel",  # a client's first use sets up MLflow's tracing
    "opentelemetry.sdk.metrics",
    "sqlalchemy.dialects.sqlite",
    "alembic.command",  # MLflow checks a store's schema version on connecting
    "alembic.config",
    "torch.distributed.algorithms.ddp_comm_hooks",
    "torch.distributed.tensor.parallel.ddp",  # DDP over tensor-parallel shards
)


def preload() -> None:
    collector.pause()
    for name in MODULES:
        importlib.import_module(name)
    for spec in SPECS.values():  # each model's folder: its module, config, spec, parallel plan
        package = importlib.import_module(spec.target.rsplit(".", 2)[0])
        for found in pkgutil.iter_modules(package.__path__, f"{package.__name__}."):
            importlib.import_module(found.name)
    from PIL import Image

    Image.init()  # every image plugin: matplotlib's PNG writer would load them at the first save
    collector.resume()  # the imports frozen before the server forks


preload()
