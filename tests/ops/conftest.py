"""Fixtures of the operations tests: real workers, the dashboard, headless Chromium.

One Taskiq worker, one Celery worker, one Dramatiq worker, one Protean
engine and one dashboard serve every test of a module (module scope: starting them is what costs
time). Chromium is
Debian's (``/usr/bin/chromium``, or ``$SIMPLEBROKER_REDIS_CHROMIUM``),
driven by Playwright without a browser download. With
``SIMPLEBROKER_REDIS_REQUIRE_BROWSER=1`` (CI) a missing browser fails the
tests instead of skipping them.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from opshelpers import (
    CHROMIUM_FLAGS,
    PYTHONPATH,
    TOKEN,
    Ops,
    chromium_path,
    start_dashboard,
    worker_record,
)

from simplebroker_redis.devserver import free_port
from support.namespaces import fresh_namespace
from support.processes import Children
from support.waiting import wait_for


@pytest.fixture(scope="module")
def ops(server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ops]:
    """A namespace of its own, its files, and the processes started on it."""
    folder = tmp_path_factory.mktemp("ops")
    (folder / "metrics").mkdir()
    with fresh_namespace(server.url, "ops") as namespace:
        env = {
            **os.environ,
            "PYTHONPATH": PYTHONPATH,
            "SIMPLEBROKER_REDIS_URL": server.url,
            "OPS_NS": namespace,
            "OPS_LOG": str(folder / "events.log"),
            "OPS_SPANS": str(folder / "spans.jsonl"),
            "OPS_MARKER": str(folder / "marker"),
            "OPS_METRICS_DIR": str(folder / "metrics"),
            "PROMETHEUS_MULTIPROC_DIR": str(folder / "metrics"),
            # Task statistics reach the server every half second (2 s by default).
            "SIMPLEBROKER_REDIS_TASK_STATS_INTERVAL": "0.5",
        }
        state = Ops(server.url, namespace, folder, env, Children(folder))
        try:
            yield state
        finally:
            state.children.stop_all()


def _beating(ops: Ops, kind: str, args: list[str]) -> dict[str, Any]:
    """Start the ``kind`` worker (metrics on a free port); return its heartbeat record."""
    port = free_port()
    metrics = {f"OPS_{kind.upper()}_METRICS_PORT": str(port)}
    process = ops.start(kind, args, OPS_WORKER=kind, **metrics)
    record = wait_for(
        lambda: worker_record(ops.url, ops.namespace, kind) or not process.alive(),
        60,
        f"the {kind} worker's heartbeat",
    )
    assert process.alive(), process.output()
    assert isinstance(record, dict)
    return {**record, "metrics_port": port, "process": process}


@pytest.fixture(scope="module")
def taskiq_worker(ops: Ops) -> dict[str, Any]:
    """``taskiq worker opsapps:broker`` with the metrics and tracing middlewares."""
    args = [sys.executable, "-m", "taskiq", "worker", "opsapps:broker", "--workers", "1"]
    return _beating(ops, "taskiq", args)


@pytest.fixture(scope="module")
def celery_worker(ops: Ops) -> dict[str, Any]:
    """``celery worker`` (threads pool, task events on) with metrics and tracing."""
    args = [sys.executable, "-m", "celery", "-A", "opsapps:app", "worker", "-P", "threads"]
    args += ["-c", "2", "-Q", "celery", "-E", "--without-mingle", "--without-gossip"]
    args += ["--loglevel", "INFO", "-n", f"ops-{uuid.uuid4().hex[:6]}@%h"]
    return _beating(ops, "celery", args)


@pytest.fixture(scope="module")
def dramatiq_worker(ops: Ops) -> dict[str, Any]:
    """``dramatiq opsdramatiq`` (one process, two threads) on the queue ``dramatiq``."""
    args = [sys.executable, "-m", "dramatiq", "opsdramatiq", "--processes", "1"]
    args += ["--threads", "2", "--queues", "dramatiq"]
    return _beating(ops, "dramatiq", args)


@pytest.fixture(scope="module")
def protean_worker(ops: Ops) -> Any:
    """Protean's engine running ``opsprotean``'s handler (one consumer group).

    Its lease heartbeat (and so its worker record) starts with its first
    reservation; it is ready once its loop runs.
    """
    process = ops.children.start(
        "protean",
        # Imported, not run as __main__: its consumer group is "opsprotean.Reporter".
        [sys.executable, "-c", "import opsprotean; opsprotean.engine()"],
        ops.env,
        ready=lambda p: "opsprotean ready" in p.output(),
    )
    return process.wait_ready()


@pytest.fixture(scope="module")
def dashboard(ops: Ops) -> str:
    """The dashboard with actions allowed (logged in with :data:`TOKEN`)."""
    return start_dashboard(ops, "dashboard", "--allow-actions", "--token", TOKEN)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless Debian Chromium through Playwright (fails, not skips, when required)."""
    path = chromium_path()
    if path is None:
        message = "no chromium binary (apt-get install chromium)"
        if os.environ.get("SIMPLEBROKER_REDIS_REQUIRE_BROWSER"):
            pytest.fail(message + " and SIMPLEBROKER_REDIS_REQUIRE_BROWSER is set")
        pytest.skip(message)
    from playwright.sync_api import sync_playwright

    # Playwright gives every launch a new, empty profile directory of its own.
    with sync_playwright() as playwright:
        instance = playwright.chromium.launch(
            executable_path=path, headless=True, args=CHROMIUM_FLAGS
        )
        try:
            yield instance
        finally:
            instance.close()
