"""pytest plugin loaded into Celery's own integration suite by ``celery_suites.py``.

It is not part of this project's test suite (``make test`` never collects
it): the harness runs Celery's ``t/integration/`` from a temp extraction with
``-p celery_peer_plugin``, for Celery's Redis transport and backend and for
ours alike, so that both runs are measured the same way.

What it changes, on every side:

- ``celery_simplebroker`` is imported, so that ``simplebroker+redis://``
  broker URLs resolve (an app module does the same; see docs/celery.md).
- ``$PEER_ALIAS_REDIS=1`` points Celery's ``redis`` result backend alias at
  our backend. Celery's suite runs about 100 tests only when
  ``result_backend`` starts with ``redis`` (they read and write the server
  directly with redis-py, around the backend); with the alias those run on
  our backend, its URL ``redis://...`` given to it as to Celery's.
- ``Manager.wait_until_idle`` (the ``manager`` fixture's teardown) gives up
  after ``$PEER_IDLE_TIMEOUT`` seconds: it loops forever while a worker
  process is stuck, and pytest-timeout does not cover a teardown that runs
  after the test's own timeout fired. The suite goes on (the stuck task then
  shows in the next tests' results).
- ``$PEER_ONLY`` names a file of node IDs: only those run.
- ``$PEER_REPORT`` names a JSON-lines file: one record per test phase
  (outcome, xfail, first line of the failure), and one when a test starts,
  so a run killed from outside still shows which test it was in.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from celery.app import backends
from celery.contrib.testing import manager as testing_manager

import celery_simplebroker  # noqa: F401 - registers the "simplebroker" kombu transport

if os.environ.get("PEER_ALIAS_REDIS") == "1":
    backends.BACKEND_ALIASES["redis"] = "celery_simplebroker.backend:SimpleBrokerBackend"

IDLE_TIMEOUT = float(os.environ.get("PEER_IDLE_TIMEOUT", "60"))
_REPORT = os.environ.get("PEER_REPORT")


def _bounded_wait_until_idle(self: Any) -> None:
    """Celery's ``wait_until_idle``, ending with TimeoutError after ``IDLE_TIMEOUT`` s."""
    control = self.app.control
    deadline = time.monotonic() + IDLE_TIMEOUT
    with self.app.connection() as connection:
        while control.purge(connection=connection):
            if time.monotonic() > deadline:
                raise TimeoutError("the queue never stayed empty")
        inspect = control.inspect()
        inspect.connection = connection
        while True:
            try:
                active = inspect.active() or {}
            except Exception as exc:  # noqa: BLE001 - as Celery's loop, which stops on ContentDisallowed
                if type(exc).__name__ == "ContentDisallowed":
                    return
                raise
            if sum(len(tasks) for tasks in active.values()) == 0:
                return
            if time.monotonic() > deadline:
                busy = f"the worker was still busy after {IDLE_TIMEOUT:.0f} s: {active}"
                raise TimeoutError(busy)


testing_manager.ManagerMixin.wait_until_idle = _bounded_wait_until_idle


def _write(record: dict[str, Any]) -> None:
    if _REPORT:
        with open(_REPORT, "a", encoding="utf-8") as out:
            out.write(json.dumps(record) + "\n")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep only the node IDs listed in ``$PEER_ONLY`` (when set)."""
    only = os.environ.get("PEER_ONLY")
    if not only:
        return
    wanted = set(Path(only).read_text(encoding="utf-8").split())
    kept = [item for item in items if item.nodeid in wanted]
    dropped = [item for item in items if item.nodeid not in wanted]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = kept


def pytest_runtest_logstart(nodeid: str, location: tuple[str, int | None, str]) -> None:
    """Record that a test started (a run killed from outside shows where it was)."""
    _write({"nodeid": nodeid, "when": "start", "time": time.time()})


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Record the outcome of one phase of a test."""
    message = ""
    if report.failed and report.longrepr is not None:
        crash = getattr(report.longrepr, "reprcrash", None)
        message = crash.message if crash is not None else str(report.longrepr)
    elif report.skipped and isinstance(report.longrepr, tuple):
        message = str(report.longrepr[2])
    _write(
        {
            "nodeid": report.nodeid,
            "when": report.when,
            "outcome": report.outcome,
            "xfail": hasattr(report, "wasxfail"),
            "subtest": type(report).__name__ != "TestReport",
            "duration": round(report.duration, 2),
            "message": message.splitlines()[0][:300] if message else "",
        }
    )
