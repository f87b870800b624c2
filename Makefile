# simplebroker-redis developer commands. Everything runs in ./.venv, which
# `make install` creates from pyproject.toml (no system packages needed).

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: install lint typecheck pytest test demo demo-celery bench peer-tests server clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -e '.[dev,hiredis,taskiq,celery]'
	touch $@

install: $(VENV)/.installed

lint: install
	$(BIN)/ruff check src tests benchmarks examples

typecheck: install
	$(BIN)/mypy

# Starts its own server (bundled Valkey, or $$SIMPLEBROKER_REDIS_SERVER).
pytest: install
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test: lint typecheck pytest

# A local server for development: the bundled Valkey, AOF with fsync always,
# data kept in $(SERVER_DIR); it prints its URL and runs until Ctrl-C. (The
# server changes into its --dir, so the path must be absolute.)
SERVER_PORT ?= 6379
SERVER_DIR ?= .server
server: install
	$(BIN)/python -m simplebroker_redis.devserver --dir $(abspath $(SERVER_DIR)) --port $(SERVER_PORT) --aof

demo: install
	$(BIN)/python examples/demo.py

demo-celery: install
	$(BIN)/python examples/celery_demo.py

bench: install
	$(BIN)/python -m pip install -q -e '.[bench]'
	$(BIN)/python benchmarks/run.py

# Celery's own integration suites (t/integration/ of the installed Celery
# version) on Celery's Redis transport and on ours, side by side; not part of
# `make test` (about 40 minutes). PEER_ARGS, e.g.: --suites tasks -k revoke,
# --source <Celery checkout or git dir>. The summary goes to .peer/celery-summary.md.
PEER_ARGS ?=
peer-tests: install
	$(BIN)/python tests/peer/celery_suites.py $(PEER_ARGS)

clean:
	rm -rf $(VENV) .demo .server .peer .pytest_cache .mypy_cache .ruff_cache
