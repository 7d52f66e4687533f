"""What the package promises (Pythons, torch releases) and what the project's machines install."""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from runner.metrics import EXAMPLE_Y_HAT
from tests.helpers.records import all_runs

ROOT = Path(__file__).resolve().parent.parent
SUPPORTED = ["3.11", "3.12", "3.13"]
SOURCES = ["runner", "plugins", "benchmarks", "tests"]


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


def _installed_without_the_source(tmp_path: Path) -> Path:
    """A wheel built from a copy of the sources, installed (not editable) into a fresh target: a
    folder that holds the package and nothing of the repository."""
    source = tmp_path / "source"
    for part in ("runner", "plugins", "conf", "experiments"):
        shutil.copytree(ROOT / part, source / part, ignore=shutil.ignore_patterns("__pycache__"))
    for part in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(ROOT / part, source / part)
    wheels = tmp_path / "wheels"
    build = ["wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(source)]
    pip(*build)
    (wheel,) = wheels.glob("parallel_runner-*.whl")
    site = tmp_path / "site"
    pip("install", "--no-deps", "--target", str(site), str(wheel))
    return site


def pip(*args: str) -> None:
    ran = subprocess.run(
        [sys.executable, "-m", "pip", "--quiet", *args], capture_output=True, text=True, timeout=240
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr


@pytest.mark.slow
def test_a_wheel_installed_into_a_fresh_environment_runs_from_any_directory(
    tmp_path: Path,
) -> None:
    site = _installed_without_the_source(tmp_path)
    assert (site / "runner" / "conf" / "config.yaml").is_file()
    assert (site / "runner" / "experiments" / "seed_neuron.yaml").is_file()
    assert not (site / "conf").exists() and not (site / "experiments").exists()
    # The Hydra plugins in Hydra's namespace, where it discovers them; no package named plugins
    plugins = {"runner_sweeper", "runner_studies", "runner_slurm", "runner_mlflow_sweep"}
    assert plugins <= {p.name for p in (site / "hydra_plugins").iterdir()}
    assert not (site / "hydra_plugins" / "__init__.py").exists()  # a namespace others add to
    assert not (site / "plugins").exists()
    # A fresh environment: the installed package first, this one's dependencies after it, and no
    # repository on the path (the working folder is elsewhere).
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MLFLOW_TRACKING_URI")}
    env["PYTHONPATH"] = str(site)
    probe = [sys.executable, "-P", "-c", "import runner; print(runner.__file__)"]
    where = subprocess.run(probe, cwd=elsewhere, env=env, capture_output=True, text=True)
    assert where.stdout.startswith(str(site)), where.stdout + where.stderr
    done = subprocess.run(
        [sys.executable, "-P", "-m", "runner", "+experiment=seed_neuron"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (run,) = all_runs(f"sqlite:///{elsewhere / 'mlflow.db'}")
    assert run.info.status == "FINISHED"
    assert round(run.data.metrics[EXAMPLE_Y_HAT.name], 3) == 0.992  # the seed's worked neuron
