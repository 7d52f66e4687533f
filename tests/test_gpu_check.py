"""make gpu-check: on a machine without a GPU it refuses in one line; its checks, rehearsed on
this CPU with a small model, pass and print one table."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import copy_of_the_repository


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: gpu-check would run")
def test_without_a_gpu_it_says_so_in_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_check"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert done.stdout == "" and len(done.stderr.strip().splitlines()) == 1
    assert "no CUDA GPU" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.slow
@pytest.mark.timeout(900)  # about 11 short trainings: 2 min here, more on a slower machine
def test_its_checks_rehearsed_on_this_cpu_pass(tmp_path: Path) -> None:
    """In a copy of the repository: check 4 writes the copy's conf/hardware/calibrated.yaml."""
    repo = copy_of_the_repository(tmp_path / "repo")
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_check", "--on-cpu"],
        cwd=repo,
        env=os.environ | {"PYTHONPATH": str(repo)},
        capture_output=True,
        text=True,
        timeout=850,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    checks = ("1.", "2.", "3.", "4.", "5.", "6.")
    rows = [line for line in done.stdout.splitlines() if line[:2] in checks]
    assert len(rows) == 9 and all("  pass  " in row for row in rows), done.stdout
    assert "sharing one CPU (two torchrun nodes)" in done.stdout  # the one-GPU machine's path
    assert "10 steps redone" in done.stdout
    assert (repo / "conf" / "hardware" / "calibrated.yaml").is_file()
