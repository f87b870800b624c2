# simplebroker-redis developer commands. Everything runs in ./.venv, which
# `make install` creates from pyproject.toml (no system packages needed).

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: install lint typecheck pytest test demo demo-celery bench server clean peer-tests-kombu

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -e '.[dev,hiredis,taskiq,celery]'
	touch $@

install: $(VENV)/.installed

lint: install
	$(BIN)/ruff check src tests benchmarks examples peer

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

# kombu's own integration tests on our transport beside kombu's redis:// (about
# 2 min; not part of `make test`). KOMBU_SOURCE: a kombu sdist, source tree or
# git directory (KOMBU_REV: its tag; default: the installed version's sdist, kept in .peer/).
peer-tests-kombu: install
	$(BIN)/python peer/kombu/run.py $(if $(KOMBU_SOURCE),--kombu $(KOMBU_SOURCE)) $(if $(KOMBU_REV),--rev $(KOMBU_REV))

clean:
	rm -rf $(VENV) .demo .server .peer .pytest_cache .mypy_cache .ruff_cache
