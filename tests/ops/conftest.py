"""Fixtures of the operations tests: real workers, the dashboard, headless Chromium.

One Taskiq worker, one Celery worker and one dashboard serve every test of
a module (module scope: starting them is what costs time). Chromium is
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
    Ops,
    chromium_path,
    free_port,
    start_dashboard,
    wait_for,
    worker_record,
)

from simplebroker_redis import redis_backend_plugin


@pytest.fixture(scope="module")
def ops(server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ops]:
    """A namespace of its own, its files, and the processes started on it."""
    namespace = f"ops-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    folder = tmp_path_factory.mktemp("ops")
    (folder / "metrics").mkdir()
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
    }
    state = Ops(server.url, namespace, folder, env, [])
    try:
        yield state
    finally:
        for process in state.processes:
            process.stop()
        redis_backend_plugin.cleanup_target(server.url, backend_options={"namespace": namespace})


@pytest.fixture(scope="module")
def taskiq_worker(ops: Ops) -> dict[str, Any]:
    """``taskiq worker opsapps:broker`` with the metrics and tracing middlewares."""
    port = free_port()
    process = ops.start(
        "taskiq",
        [sys.executable, "-m", "taskiq", "worker", "opsapps:broker", "--workers", "1"],
        OPS_WORKER="taskiq",
        OPS_TASKIQ_METRICS_PORT=str(port),
    )
    record = wait_for(
        lambda: worker_record(ops.url, ops.namespace, "taskiq") or not process.alive(),
        60,
        "the Taskiq worker's heartbeat",
    )
    assert process.alive(), process.output()
    assert isinstance(record, dict)
    return {**record, "metrics_port": port, "process": process}


@pytest.fixture(scope="module")
def celery_worker(ops: Ops) -> dict[str, Any]:
    """``celery worker`` (threads pool, task events on) with metrics and tracing."""
    port = free_port()
    args = [sys.executable, "-m", "celery", "-A", "opsapps:app", "worker", "-P", "threads"]
    args += ["-c", "2", "-Q", "celery", "-E", "--without-mingle", "--without-gossip"]
    args += ["--loglevel", "INFO", "-n", f"ops-{uuid.uuid4().hex[:6]}@%h"]
    process = ops.start("celery", args, OPS_WORKER="celery", OPS_CELERY_METRICS_PORT=str(port))
    record = wait_for(
        lambda: worker_record(ops.url, ops.namespace, "celery") or not process.alive(),
        60,
        "the Celery worker's heartbeat",
    )
    assert process.alive(), process.output()
    assert isinstance(record, dict)
    return {**record, "metrics_port": port, "process": process}


@pytest.fixture(scope="module")
def dashboard(ops: Ops) -> str:
    """The dashboard with actions allowed."""
    return start_dashboard(ops, "dashboard", "--allow-actions")


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
