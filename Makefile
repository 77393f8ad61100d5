# gwtf: two commands do all the set-up on a fresh machine.
#   make demo   creates/reuses .venv, installs everything, runs the main job
#   make test   creates/reuses .venv, installs everything, runs lint + layering + tests
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test lint unit sim integration clean docker docker-test system-deps flake-hunt

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# CPU machines get the CPU build of torch (2.13.0 is on the local index); GPU users keep their usual torch.
$(STAMP): $(BIN)/python pyproject.toml setup.py
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
	$(BIN)/ruff check gwtfp2p cli tests benchmarks docker setup.py
	$(BIN)/lint-imports

# What the tests drive besides Python: Debian's chromium (the status page in a real browser), iproute2
# and iptables (network namespaces, veth, a NAT router, tc tbf). apt-get installs what is missing (as root).
system-deps:
	@missing=""; \
	command -v chromium >/dev/null 2>&1 || missing="$$missing chromium"; \
	command -v ip >/dev/null 2>&1 && command -v tc >/dev/null 2>&1 || missing="$$missing iproute2"; \
	command -v iptables >/dev/null 2>&1 || missing="$$missing iptables"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing$$missing"; apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	  else echo "make test needs:$$missing (apt-get install them as root)"; exit 1; fi; \
	fi

# Unit and simulator tests (pure CPU) on two pytest-xdist workers; then the suites of real processes in
# this process, one test at a time (tests/packaging builds the wheel, installs it into a clean venv and
# runs gwtf from it). TEST_WORKERS=0 runs the first part in one process too. Both parts run to the end
# (no -x); each closing summary names every failure with its first error line, every retried test
# (real-process tests only, at most twice: tests/conftest.py, docs/testing.md) and the slowest tests.
TEST_WORKERS ?= 2
test: lint system-deps
	@status=0; \
	$(BIN)/python -m pytest -q -rfE --durations=10 $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS)) \
	  tests/unit tests/sim || status=1; \
	$(BIN)/python -m pytest -q -rfER --durations=15 tests/adversarial tests/integration tests/packaging || status=1; \
	exit $$status

# The real-process suites N times as CI runs them (fresh clone, fresh .venv, CI=true, no stdin, no retries),
# with a table of every test's passes and failures (benchmarks/flake_hunt.py, docs/testing.md).
N ?= 5
flake-hunt:
	$(PY) benchmarks/flake_hunt.py --rounds $(N)

# Docker images (docker/README.md). DOCKER_SOURCES=public: the registry's python:3.11-slim and the
# public indexes, as a volunteer builds; local: a debootstrap base and a wheelhouse, for machines that
# reach Debian's and PyPI's packages only (it also starts a dockerd where none runs, and stops it).
DOCKER_SOURCES ?= public
DOCKER_VARIANTS ?= cpu cuda
docker:
	nice -n 19 $(PY) docker/images.py --sources $(DOCKER_SOURCES) $(addprefix --variant ,$(DOCKER_VARIANTS)) \
	  $(if $(filter local,$(DOCKER_SOURCES)),--start-engine)

# CI: builds the CPU image the way this machine allows and runs a 3-container swarm from it (docker/ci_test.py).
# It runs beside the tests on the CPU they leave idle: SCHED_IDLE (chrt --idle, where util-linux has it; its
# dockerd, builds and containers inherit it) and nice 19. A waking test process preempts a SCHED_IDLE task at
# once, where a nice-19 one still delays it (docs/testing.md, "How CI runs").
IDLE_CPU := $(shell command -v chrt >/dev/null 2>&1 && echo chrt --idle 0) nice -n 19
docker-test:
	$(IDLE_CPU) $(PY) docker/ci_test.py

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
