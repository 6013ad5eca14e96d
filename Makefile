# Set-up and checks. `make demo` and `make test` do everything on a fresh machine.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=

.PHONY: all venv build demo test test-pure bench chaos clean

all: test

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip 'setuptools>=77' wheel 'Cython>=3.0.10'

# Installs the project with its dev extras and builds the Cython extensions in place.
$(STAMP): $(BIN)/python pyproject.toml setup.py
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	$(MAKE) build
	touch $(STAMP)

venv: $(STAMP)

build: $(BIN)/python
	$(BIN)/python setup.py --quiet build_ext --inplace

demo: $(STAMP)
	$(BIN)/python -m fxworker demo $(if $(PORT),--port $(PORT))

# The suite starts its own throwaway redis-server on a free port (see DEVELOPERS.md);
# FX_TEST_REDIS_URL points it at another server instead.
test: $(STAMP)
	@command -v redis-server >/dev/null || [ -n "$$FX_TEST_REDIS_URL" ] || { \
	  echo "make test needs redis-server on PATH (Debian/Ubuntu: apt-get install redis-server;" \
	       "macOS: brew install redis) or FX_TEST_REDIS_URL=redis://host:port/db"; exit 1; }
	$(BIN)/python setup.py --quiet build_ext --inplace
	$(BIN)/python -m mypy  # strict, both packages ([tool.mypy] in pyproject.toml)
	$(BIN)/python -m pytest $(PYTEST_ARGS)
	FXENGINE_NO_EXTENSIONS=1 $(BIN)/python -m pytest -m "not slow and not celery and not browser and not cluster" tests/engine $(PYTEST_ARGS)

# Every bench once (bench/run_all.py, under 10 minutes): one table of figures beside their
# same-run baselines; bench/results/summary.json and the PNG plots. Needs the bench extra.
bench: $(STAMP)
	@$(BIN)/python -c "import matplotlib, agents, langgraph, langchain_openai, msgspec" 2>/dev/null || \
	  $(BIN)/python -m pip install --quiet -e '.[dev,bench]'
	$(BIN)/python setup.py --quiet build_ext --inplace
	$(BIN)/python bench/run_all.py

# The fault-injection run (tests/chaos/run.py): its own Redis (AOF), the web process, 3
# Celery workers, a seeded workload and nemesis, then the §11 checker. Fails printing the
# seed; results go to tests/chaos/results/. Soak: make chaos DURATION=600 SEED=7. More
# options through CHAOS_ARGS (python -m tests.chaos.run --help). CLUSTER=1: the store on a
# Redis Cluster (3 primaries + 3 replicas, FX_ACK=replica), and the nemesis kills primaries.
DURATION ?= 90
SEED ?=
CLUSTER ?=
chaos: $(STAMP)
	@command -v redis-server >/dev/null || { echo "make chaos needs redis-server on PATH"; exit 1; }
	$(BIN)/python setup.py --quiet build_ext --inplace
	$(BIN)/python -m tests.chaos.run --duration $(DURATION) $(if $(SEED),--seed $(SEED)) $(if $(CLUSTER),--cluster) $(CHAOS_ARGS)

clean:
	rm -rf build $(VENV) *.egg-info
	find fxengine -name '*.so' -delete
