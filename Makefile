# LEO: `make run` installs into ./.venv and runs the main job; `make test` installs and runs every check.
VENV    ?= .venv
PY      := $(VENV)/bin/python
PIP     := $(PY) -m pip
TORCH_PIN ?= torch==2.13.0
STAMP   := $(VENV)/.installed

.PHONY: install run test lint typecheck pytest cuda-check test-gpu clean

install: $(STAMP)

# Torch goes in first and only when missing, so GPU users keep their own build and the
# unpinned range in pyproject.toml never pulls a multi-GB CUDA wheel.
$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install -q "$(TORCH_PIN)"
	$(PIP) install -q -e ".[dev,peers]"
	touch $(STAMP)

run: install
	$(VENV)/bin/leo train

lint: install
	$(VENV)/bin/ruff check leo_cli tests
	$(VENV)/bin/ruff format --check leo_cli tests

typecheck: install
	$(VENV)/bin/mypy

cuda-check: install
	@if command -v nvcc >/dev/null 2>&1; then $(VENV)/bin/leo compile --check; \
	else echo "cuda-check skipped: nvcc not found on PATH"; fi

pytest: install
	$(VENV)/bin/pytest -q

test: lint typecheck cuda-check pytest

# On a GPU machine: build the kernels, GPU tests, kernel benchmark (logs in gpu-check/).
test-gpu: install
	scripts/gpu-check.sh gpu-check

clean:
	rm -rf $(VENV) build *.egg-info
