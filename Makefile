# simplebroker-redis developer commands. Everything runs in ./.venv, which
# `make install` creates from pyproject.toml and the tested versions in
# constraints.txt (no system packages needed).

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=
# The versions installed: the lock of tested versions (empty: the newest
# releases pyproject.toml's ranges allow).
CONSTRAINTS ?= constraints.txt
EXTRAS := dev,hiredis,taskiq,celery,protean,dramatiq
PIP_INSTALL = $(BIN)/python -m pip install -q $(if $(CONSTRAINTS),-c $(CONSTRAINTS))

.PHONY: install lint typecheck pytest test test-latest test-oldest lock demo demo-celery \
	demo-protean bench celery-faults server clean peer-tests peer-tests-celery peer-tests-kombu \
	peer-tests-protean peer-tests-dramatiq demo-dramatiq dramatiq-kill-trial nemesis

$(VENV)/.installed: pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(PIP_INSTALL) $(PIP_FLAGS) -e '.[$(EXTRAS)]'
	touch $@

install: $(VENV)/.installed

lint: install
	$(BIN)/ruff check src tests benchmarks examples peer_suites

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

# The whole of `make test` on the newest releases the ranges allow, in its own
# venv, reinstalled each time (not part of CI: it shows drift before a `make
# lock` takes it in).
test-latest:
	rm -f .venv-latest/.installed
	$(MAKE) test VENV=.venv-latest CONSTRAINTS= PIP_FLAGS='--upgrade --upgrade-strategy eager'

# The suite on the oldest releases pyproject.toml accepts (constraints-oldest.txt
# pins each declared lower bound); not part of CI.
test-oldest:
	rm -f .venv-oldest/.installed
	$(MAKE) pytest VENV=.venv-oldest CONSTRAINTS=constraints-oldest.txt

# Rewrites constraints.txt from the newest releases, every extra included.
lock:
	rm -rf .venv-lock
	$(PYTHON) -m venv .venv-lock
	.venv-lock/bin/python -m pip install -q -e '.[$(EXTRAS),server,metrics,dashboard,otel,bench]'
	{ sed -n '/^#/p' constraints.txt; .venv-lock/bin/python -m pip freeze --exclude-editable; } \
		> constraints.txt.new
	mv constraints.txt.new constraints.txt
	rm -rf .venv-lock

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

# `dramatiq dramatiq_app --processes 2 --threads 4` on the local Valkey, tasks and results.
demo-dramatiq: install
	$(BIN)/python examples/dramatiq_demo.py

# Two Protean workers on a SQLite file (no server); DEMO_ARGS=--redis for Valkey.
demo-protean: install
	$(BIN)/python examples/protean_demo.py $(DEMO_ARGS)

bench: install
	$(PIP_INSTALL) -e '.[bench]'
	$(BIN)/python benchmarks/run.py

# Issue 42's Celery scenarios, measured: 300 tasks per run through a fault
# proxy, each fault CELERY_FAULT_RUNS times (3; about 20 minutes), one JSON
# line per run (also appended to $$CELERY_FAULTS_OUT): docs/celery.md's table.
# Not part of `make test` (its regression tests are tests/celery/test_celery_network.py).
celery-faults: install
	$(BIN)/python -m pytest tests/celery/scenario_faults.py -q -s $(PYTEST_ARGS)

# Protean's own broker tests (its capability suite, the BLOCKING_READ tests and
# the DLQ tests of its inline and redis providers) on our provider over Redis
# and over SQLite, beside Protean's own provider: docs/protean.md. PROTEAN_SOURCE
# takes a Protean sdist, source tree or git directory (default: the installed
# version's sdist, kept in .peer/). A few minutes; not part of `make test`.
peer-tests-protean: install
	$(BIN)/python -m pip install -q httpx  # Protean's tests/conftest.py imports starlette's TestClient
	$(BIN)/python peer_suites/protean/run.py $(if $(PROTEAN_SOURCE),--protean $(PROTEAN_SOURCE))

# kombu's own integration tests on our transport beside kombu's redis:// (about
# 2 min; not part of `make test`). KOMBU_SOURCE: a kombu sdist, source tree or
# git directory (KOMBU_REV: its tag; default: the installed version's sdist, kept in .peer/).
peer-tests-kombu: install
	$(BIN)/python peer_suites/kombu/run.py $(if $(KOMBU_SOURCE),--kombu $(KOMBU_SOURCE)) $(if $(KOMBU_REV),--rev $(KOMBU_REV))

# Celery's own integration suites (t/integration/ of the installed Celery
# version) on Celery's Redis transport and on ours, side by side; not part of
# `make test` (about 40 minutes). PEER_ARGS, e.g.: --suites tasks -k revoke,
# --source <Celery checkout or git dir>. The summary goes to .peer/celery-summary.md.
PEER_ARGS ?=
peer-tests-celery: install
	$(BIN)/python peer_suites/celery/celery_suites.py $(PEER_ARGS)

# 20 SIGKILLs of a `dramatiq` worker mid-task with the default 10 s lease: nothing
# lost, and the time to redelivery of each kill printed (docs/dramatiq.md). About 5 min.
dramatiq-kill-trial: install
	DQ_KILLS=20 DQ_KILL_LEASE=10 $(BIN)/python -m pytest -s -q -o timeout=1800 \
		tests/dramatiq/test_dramatiq_worker.py -k sigkilled

# Dramatiq's own tests on its RedisBroker and on ours, side by side (docs/dramatiq.md).
# DRAMATIQ_SOURCE: a Dramatiq git directory or source tree (its sdist has no
# tests/conftest.py; default: a clone in .peer/); DRAMATIQ_REV: its revision.
# DRAMATIQ_ARGS: more pytest arguments (-- -k retries). A few minutes; not part of `make test`.
peer-tests-dramatiq: install
	$(BIN)/python -m pip install -q pika==1.4.4  # Dramatiq's tests/common.py imports it (RabbitMQ)
	$(BIN)/python peer_suites/dramatiq/run.py $(if $(DRAMATIQ_SOURCE),--dramatiq $(DRAMATIQ_SOURCE)) $(if $(DRAMATIQ_REV),--rev $(DRAMATIQ_REV)) $(DRAMATIQ_ARGS)

# All four peer suites (about 55 minutes in all).
peer-tests: peer-tests-celery peer-tests-kombu peer-tests-protean peer-tests-dramatiq
# The nemesis suite's long run (docs/reliability.md): every fault x every
# workload x NEMESIS_RUNS runs, one after another (about an hour: leave the
# machine otherwise idle, the runs measure timing). The summary (markdown)
# goes to $(NEMESIS_OUT), each run's logs next to it in runs/. `make test`
# runs the short version (one run of each fault, tests/nemesis/test_*.py).
# NEMESIS_ARGS, e.g.: --faults sigstop-worker,reset-and-refuse --workloads celery
# (--list names them all). Exits 1 when any run found an anomaly.
NEMESIS_RUNS ?= 3
NEMESIS_OUT ?= .nemesis/summary.md
NEMESIS_ARGS ?=
nemesis: install
	PYTHONPATH=tests $(BIN)/python -m nemesis.campaign --runs $(NEMESIS_RUNS) \
		--out $(NEMESIS_OUT) $(NEMESIS_ARGS)


clean:
	rm -rf $(VENV) .venv-latest .venv-oldest .demo .server .peer .nemesis .pytest_cache \
		.mypy_cache .ruff_cache
