# simplebroker-redis developer commands. Everything runs in ./.venv, which
# `make install` creates from pyproject.toml (no system packages needed).

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: install lint typecheck pytest test demo demo-celery bench server clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -e '.[dev,hiredis,taskiq,celery]'
	touch $@

install: $(VENV)/.installed

lint: install
	$(BIN)/ruff check src tests benchmarks examples

typecheck: install
	$(BIN)/mypy

# Starts its own servers (bundled Valkey, or $$SIMPLEBROKER_REDIS_SERVER), one
# set per test process. The suite spends most of its time waiting (leases
# expiring, workers starting), so it runs in $(PYTEST_WORKERS) processes even
# on 2 cores; a test file stays in one process (its module fixtures are
# shared). PYTEST_WORKERS=0 runs it in this process.
PYTEST_WORKERS ?= 3
pytest: install
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

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

clean:
	rm -rf $(VENV) .demo .server .pytest_cache .mypy_cache .ruff_cache
