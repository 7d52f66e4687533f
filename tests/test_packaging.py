"""What the package promises (Pythons, torch releases) and what the project's machines install."""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

ROOT = Path(__file__).resolve().parent.parent
SUPPORTED = ["3.11", "3.12", "3.13"]
SOURCES = ["runner", "plugins", "hydra_plugins", "benchmarks", "tests"]


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _torch() -> Requirement:
    (torch,) = [r for r in map(Requirement, _project()["dependencies"]) if r.name == "torch"]
    return torch


def test_the_supported_pythons_are_admitted_and_classified() -> None:
    project = _project()
    admitted = SpecifierSet(project["requires-python"])
    for version in SUPPORTED:
        assert admitted.contains(f"{version}.0"), version
        assert f"Programming Language :: Python :: {version}" in project["classifiers"]
    assert not admitted.contains("3.10.13")


def test_torch_is_a_range_from_the_gpu_machines_release_on() -> None:
    torch = _torch()
    assert torch.specifier.contains("2.11.0")
    assert torch.specifier.contains("2.13.0")
    assert not any(s.operator in ("==", "===") for s in torch.specifier)


def test_the_project_machines_install_the_pinned_cpu_build() -> None:
    lines = (ROOT / "constraints.txt").read_text().splitlines()
    pins = [Requirement(line) for line in lines if line.strip() and not line.startswith("#")]
    assert [(r.name, str(r.specifier)) for r in pins] == [("torch", "==2.13.0")]
    makefile = (ROOT / "Makefile").read_text()
    # make run / make test; make gpu-check's environment takes the GPU machine's torch instead.
    installs = [
        line for line in makefile.splitlines() if re.search(r"PY\) -m pip install .*-e ", line)
    ]
    assert installs and all("-c constraints.txt" in line for line in installs)
    assert re.search(r"^\$\(STAMP\):.*\bpyproject\.toml\b.*\bconstraints\.txt\b", makefile, re.M)


def _interpreter(version: str) -> str | None:
    """A python{version} that runs: on PATH, or where pyenv keeps it (its shim on PATH fails for a
    version that is installed but not selected)."""
    pyenv = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    candidates = [shutil.which(f"python{version}")]
    candidates += sorted(glob.glob(f"{pyenv}/versions/{version}.*/bin/python{version}"))
    for candidate in filter(None, candidates):
        probe = [candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"]
        ran = subprocess.run(probe, capture_output=True, text=True, timeout=60)
        if ran.returncode == 0 and ran.stdout.strip() == version:
            return candidate
    return None


@pytest.mark.parametrize("version", SUPPORTED)
def test_the_sources_compile_under_each_supported_python(version: str, tmp_path: Path) -> None:
    python = _interpreter(version)
    if python is None:
        pytest.skip(f"no python{version} on this machine")
    # The prefix keeps the bytecode out of the work tree.
    env = os.environ | {"PYTHONPYCACHEPREFIX": str(tmp_path)}
    ran = subprocess.run(
        [python, "-m", "compileall", "-q", *SOURCES],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
