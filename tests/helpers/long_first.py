"""A pytest plugin (pyproject.toml's addopts): the work that takes minutes is handed to the workers
first, so that no worker ends the suite alone on it while the other sits idle.

pytest-xdist's `--dist loadfile` hands out a test file at a time, and by default in the order of
how many tests each file holds (`--no-loadscope-reorder`, in addopts, keeps ours): the CPU
rehearsal of make gpu-check, one test in its file, was handed out near the end and left one of
two cores idle for its last minutes. Here each document of test_docs.py's is a unit of its own
too (they share nothing but the session's fixtures): the documents together take longer than
any file, and whole they left the other worker idle at the end.
"""

from __future__ import annotations

import pytest
from xdist.scheduler import LoadFileScheduling

DOCUMENTS = "tests/test_docs.py::test_every_command_of_the_document_runs_as_printed["
# Each unit's seconds in a whole run on the 2-core AMD EPYC, AVX2 only (2026-12-07, --durations,
# other work beside it: the order is what counts), longest first; any unit not listed takes less.
SECONDS = {
    "tests/test_gpu_check.py": 419,
    f"{DOCUMENTS}docs/parallelism.md]": 408,
    "tests/test_precision.py": 393,
    "tests/test_tensor.py": 356,
    "tests/test_studies.py": 346,
    "tests/test_slurm.py": 321,
    "tests/test_network.py": 304,
    "tests/test_sharded.py": 277,
    f"{DOCUMENTS}docs/gpus.md]": 270,
    f"{DOCUMENTS}docs/planner.md]": 243,
    "tests/test_signals.py": 241,
    "tests/test_snapshots.py": 234,
    "tests/test_search.py": 231,
    "tests/test_sequence.py": 165,
    "tests/test_pipeline.py": 142,
    "tests/test_context.py": 141,
    f"{DOCUMENTS}README.md]": 133,
    "tests/test_accumulation.py": 129,
    "tests/test_data_parallel.py": 128,
    "tests/test_mlflow_ui.py": 114,
    "tests/test_extending.py": 110,
    f"{DOCUMENTS}docs/reliability.md]": 83,
    "tests/test_training.py": 80,
    f"{DOCUMENTS}docs/measurement.md]": 69,
    "tests/test_moe.py": 65,
    "tests/test_one_store.py": 50,
    "tests/test_planner_scale.py": 47,
    "tests/test_mlflow_server.py": 45,
    f"{DOCUMENTS}docs/network.md]": 41,
}


def unit(nodeid: str) -> str:
    """The unit a test is handed out in: its document's, or its file's."""
    return nodeid if nodeid.startswith(DOCUMENTS) else nodeid.split("::", 1)[0]


class LongFirst(LoadFileScheduling):
    def _split_scope(self, nodeid: str) -> str:
        return unit(nodeid)


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> LongFirst | None:
    return LongFirst(config, log) if config.getvalue("dist") == "loadfile" else None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Stable: each unit's own order kept, and a file's tests stay together
    items.sort(key=lambda item: -SECONDS.get(unit(item.nodeid), 0))
