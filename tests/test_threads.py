"""Threads per rank: a launcher's CPU binding is the rank's share, else the node's cores divided."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from runner.launcher.threads import this_rank_threads, threads_per_rank

ROOT = Path(__file__).resolve().parents[1]
EIGHT = set(range(8))


def test_an_unbound_rank_shares_the_cores_with_the_other_ranks() -> None:
    assert threads_per_rank(EIGHT, EIGHT, 4) == 2


def test_a_bound_rank_takes_its_whole_binding() -> None:
    assert threads_per_rank({0, 1}, EIGHT, 4) == 2
    assert threads_per_rank({0, 1, 2}, EIGHT, 4) == 3
    assert threads_per_rank({5}, EIGHT, 1) == 1


def test_an_unknown_parent_counts_as_not_binding() -> None:
    assert threads_per_rank(EIGHT, None, 4) == 2
    assert threads_per_rank({0, 1, 2}, None, 4) == 1


def test_never_below_one_thread() -> None:
    assert threads_per_rank({0, 1}, {0, 1}, 8) == 1
    assert threads_per_rank({0}, None, 4) == 1


def test_this_process_unbound_from_its_parent_divides_its_cores() -> None:
    own = os.sched_getaffinity(0)
    if own < os.sched_getaffinity(os.getppid()):
        pytest.skip("this test process was started bound to fewer cores than its parent")
    assert this_rank_threads(2) == max(1, len(own) // 2)


def test_a_process_bound_below_its_parent_takes_its_binding() -> None:
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("one core: a binding below this process's cannot be made")
    # The child binds itself below this process, its parent, as a launcher would have bound it.
    code = (
        "import os; from runner.launcher.threads import this_rank_threads; "
        f"os.sched_setaffinity(0, {{{cores[0]}}}); print(this_rank_threads(1))"
    )
    ran = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "1"  # unbound, one rank would have taken all len(cores)
