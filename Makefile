# gwtf: two commands do all the set-up on a fresh machine.
#   make demo   creates/reuses .venv, installs everything, runs the main job
#   make test   creates/reuses .venv, installs everything, runs lint + layering + tests
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test lint unit sim integration clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# CPU machines get the CPU build of torch (2.13.0 is on the local index); GPU users keep their usual torch.
$(STAMP): $(BIN)/python pyproject.toml
	@if $(BIN)/python -c "import torch" 2>/dev/null; then echo "torch already installed"; \
	elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then \
	  $(BIN)/python -m pip install -q torch; \
	else \
	  $(BIN)/python -m pip install -q torch==2.13.0 || \
	  $(BIN)/python -m pip install -q torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu; \
	fi
	$(BIN)/python -m pip install -q -e ".[dev]"
	@touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/gwtf demo

lint: $(STAMP)
	$(BIN)/ruff check gwtfp2p cli tests benchmarks
	$(BIN)/lint-imports

# The whole suite to the end (no -x): unit, then simulator, then real processes. The closing summary names
# every failure with its first error line, every retried integration test (tests/conftest.py: at most two
# retries, docs/testing.md) and the slowest tests.
test: lint
	$(BIN)/python -m pytest -q -rfER --durations=15 tests/unit tests/sim tests/integration

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
