# Two commands on a fresh machine: `make run` and `make test`. Both create .venv when missing and
# install the project into it; the install is redone whenever pyproject.toml, setup.py or
# constraints.txt changes.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test bench gpu-check lint install clean

$(STAMP): pyproject.toml setup.py constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# constraints.txt pins torch==2.13.0, the CPU build on this machine's disk, not CUDA.
	$(PY) -m pip install --quiet --no-compile -c constraints.txt -e '.[dev]'
	# pip compiles the installed modules on one core (about 50 s here); compileall on every core.
	# Its exit code is ignored as pip ignores it: torch ships a file of Python 3.12's syntax.
	$(PY) -m compileall -qq -j 0 $$($(PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))') || true
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(PY) -m runner

# The tests that measure a schedule's idle time run last, one at a time with nothing beside them:
# on 2 cores the other worker's load unbalanced a pipeline's stages (pyproject.toml, `alone`).
test: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m pytest -m "not alone"
	$(PY) -m pytest -m alone -n 0

bench: $(STAMP)
	$(PY) -m benchmarks

# On a machine with CUDA GPUs (docs/gpus.md): precision, MFU, memory, data parallelism, resume,
# calibration. Its own environment sees the machine's torch (a CUDA build) and takes no CPU pin.
GPU_VENV := .venv-gpu
gpu-check:
	test -x $(GPU_VENV)/bin/python || $(PYTHON) -m venv --system-site-packages $(GPU_VENV)
	$(GPU_VENV)/bin/python -m pip install --quiet -e .
	$(GPU_VENV)/bin/python -m benchmarks.gpu_check

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

clean:
	rm -rf $(VENV) $(GPU_VENV) outputs multirun mlruns mlflow.db .pytest_cache
