# LEO: `make run` installs into ./.venv and runs the main job; `make test` installs and runs every check;
# `make test-fast` the unit tests only (ruff, then pytest without integration, dist and slow tests).
VENV    ?= .venv
PY      := $(VENV)/bin/python
PIP     := $(PY) -m pip
TORCH_PIN ?= torch==2.13.0
STAMP   := $(VENV)/.installed
CUDA_VENV  ?= .venv-cuda
CUDA_STAMP := $(CUDA_VENV)/.installed

.PHONY: install run test test-fast lint typecheck pytest cuda-check check-cuda-build test-gpu clean

install: $(STAMP)

# Torch goes in first and only when missing, so GPU users keep their own build and the
# unpinned range in pyproject.toml never pulls a multi-GB CUDA wheel. pip byte-compiles what
# it installs one file at a time (about a minute on 2 cores); the environment is compiled
# once afterwards on every core instead. A file this Python cannot compile (torch ships some
# for newer ones) stays uncompiled, as pip leaves it.
$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install -q --no-compile "$(TORCH_PIN)"
	$(PIP) install -q --no-compile -e ".[dev,peers]"
	$(PY) -m compileall -qq -j 0 $$($(PY) -c "import sysconfig as s; \
	  print(*{s.get_path('purelib'), s.get_path('platlib')})") || true
	touch $(STAMP)

run: install
	$(VENV)/bin/leo train

lint: install
	$(VENV)/bin/ruff check leo_cli tests
	$(VENV)/bin/ruff format --check leo_cli tests

# CHECK_NICE: a `nice` prefix `make test` gives the checks that run beside pytest (empty alone);
# CUDA_CHECK_JOBS: the CUDA check's parallel compilations.
CHECK_NICE ?=
CUDA_CHECK_JOBS ?= 1

typecheck: install
	$(CHECK_NICE) $(VENV)/bin/mypy

cuda-check: install
	@if command -v nvcc >/dev/null 2>&1; then $(CHECK_NICE) $(VENV)/bin/leo compile --check -j $(CUDA_CHECK_JOBS); \
	else echo "cuda-check skipped: nvcc not found on PATH"; fi

# Byte-compiled first: with PYTHONDONTWRITEBYTECODE set (CI images often set it) every
# `python -m leo_cli` and worker of the suite would compile LEO's sources again.
# PYTEST_WORKERS pytest processes (pytest-xdist) share the test files: the suite's launches
# wait on processes, timeouts and sockets much of the time, so one pytest keeps about one
# core busy. A file's tests stay in one process (its module fixtures are built once).
PYTEST_WORKERS ?= 2
PYTEST_ARGS := -q -n $(PYTEST_WORKERS) --dist loadfile
pytest: install
	$(PY) -m compileall -q -j 0 leo_cli tests
	$(VENV)/bin/pytest $(PYTEST_ARGS)

# The checks run side by side once installed: mypy and the single-threaded CUDA compile check
# take the core pytest's two-rank tests leave idle (about 2 minutes less on 2 cores); their
# few lines land among pytest's progress. Any failing check fails `make test`. They run at a
# lower priority (CHECK_NICE), so they take what pytest leaves idle rather than slowing its
# launches (the CUDA check alone is about 130 s of a core on a 2-core host), two compilations
# at a time, so that what is left of the check when pytest ends takes both cores.
test: install
	$(MAKE) --no-print-directory -j4 CHECK_NICE="nice -n 15" CUDA_CHECK_JOBS=2 lint typecheck \
	  cuda-check pytest

# The unit tests: none that starts a subprocess (integration), torch.distributed ranks (dist)
# or a long run (slow); about a minute on 2 cores. CI runs `make test`.
test-fast: install lint
	$(PY) -m compileall -q -j 0 leo_cli tests
	$(VENV)/bin/pytest $(PYTEST_ARGS) -m "not integration and not dist and not slow"

# A CUDA build of torch (the registry's default Linux x86_64 wheel: CUDA 13 for torch 2.13.0,
# ~5 GB with its nvidia-* packages) in a virtual environment of its own, never the one
# `make test` uses. No pip config file and no find-links for that install: a machine whose pip
# config points at a local CPU wheel of the same version would otherwise get that one.
$(CUDA_STAMP): pyproject.toml
	test -x $(CUDA_VENV)/bin/python || python3 -m venv $(CUDA_VENV)
	PIP_CONFIG_FILE=/dev/null PIP_FIND_LINKS= $(CUDA_VENV)/bin/python -m pip install -q \
	  "$(TORCH_PIN)" ninja setuptools wheel
	$(CUDA_VENV)/bin/python -c "import sys, torch; sys.exit(torch.version.cuda is None \
	  and f'$(CUDA_VENV) got a CPU-only torch ({torch.__version__}), not a CUDA build')"
	$(CUDA_VENV)/bin/python -m pip install -q -e .
	touch $(CUDA_STAMP)

# Without a GPU: compile and link leo_cli._C for real against that torch, then load it and
# register its kernels (scripts/check-cuda-build.sh; a few minutes on 2 cores).
check-cuda-build: $(CUDA_STAMP)
	scripts/check-cuda-build.sh $(CUDA_VENV)

# On a GPU machine, as one run that fits a 10-minute slot: build the kernels, GPU tests, a
# 2-GPU leo train against one process, kernel benchmark (logs and summary.json in gpu-check/).
# No `install` prerequisite: once .venv has a CUDA torch the script needs no package registry.
test-gpu:
	scripts/gpu-check.sh gpu-check

clean:
	rm -rf $(VENV) $(CUDA_VENV) build *.egg-info
