"""A pytest plugin (pyproject.toml's addopts): the test files that take minutes are handed to the
workers first, so that no worker ends the suite alone on one of them while the other sits idle.
Measured: the CPU rehearsal of make gpu-check, collected mid-way and handed out last, left one
of two cores idle for its last two minutes."""

from __future__ import annotations

import pytest

# The longest files, longest first (tests/README.md gives their times).
LONG = (
    "test_docs.py",
    "test_sharded.py",
    "test_gpu_check.py",
    "test_slurm.py",
    "test_signals.py",
    "test_tensor.py",
    "test_precision.py",
    "test_pipeline.py",
    "test_studies.py",
    "test_data_parallel.py",
    "test_recompute.py",
    "test_accumulation.py",
    "test_extending.py",
)


def rank(item: pytest.Item) -> int:
    name = item.path.name
    return LONG.index(name) if name in LONG else len(LONG)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=rank)  # stable: each file's own order kept
