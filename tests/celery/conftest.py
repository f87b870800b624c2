"""Fixtures for the Celery integration: the test app and real ``celery worker`` processes."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from support.eventlog import read_events
from support.processes import Children, Process, pythonpath

#: Worker processes import the test app (celeryapp.py) from this directory.
HERE = Path(__file__).resolve().parent

#: Options that make a test worker start fast: no startup sync with other workers.
FAST = ["--without-mingle", "--without-gossip", "--without-heartbeat"]


@pytest.fixture
def events(tmp_path: Path) -> Path:
    """The file tasks and worker signals of celeryapp.py append their events to."""
    return tmp_path / "events.log"


@pytest.fixture
def lease() -> float:
    """Lease seconds of this test's workers and app (tests override it)."""
    return 10.0


@pytest.fixture
def celery_url(redis_url: str) -> str:
    """The server the test's app and workers use (fault tests override it)."""
    return redis_url


@pytest.fixture
def app(celery_url: str, namespace: str, events: Path, lease: float) -> Iterator[Any]:
    """A producer-side Celery app on this test's namespace."""
    from celeryapp import make_app

    application = make_app(celery_url, namespace, str(events), lease)
    yield application
    application.close()


@pytest.fixture
def celery_env(celery_url: str, namespace: str, events: Path, lease: float) -> dict[str, str]:
    """Environment of ``celery`` processes running celeryapp.py on this test's server."""
    return {
        **os.environ,
        "PYTHONPATH": pythonpath(HERE),
        "SIMPLEBROKER_REDIS_URL": celery_url,
        "CELERY_NS": namespace,
        "CELERY_LOG": str(events),
        "CELERY_LEASE": str(lease),
    }


@pytest.fixture
def start_worker(
    celery_env: dict[str, str], events: Path, children: Children
) -> Callable[..., Process]:
    """Start ``celery worker`` processes (``-P solo`` by default); all are killed afterwards.

    A worker is ready once its ``worker_ready`` signal's line is in the event
    log (never a fixed sleep); ``ready=False`` returns without waiting.
    """

    def logged_ready(worker: Process) -> bool:
        return any(event.pid == worker.pid for event in read_events(events, "ready"))

    def start(
        name: str,
        *extra: str,
        pool: str = "solo",
        concurrency: int = 1,
        queues: str = "celery",
        fast: bool = True,
        ready: bool = True,
        acks_late: bool = True,
        env: dict[str, str] | None = None,
    ) -> Process:
        args = ["worker", "-P", pool, "-c", str(concurrency), "-n", f"{name}@%h", "-Q", queues]
        args += ["--loglevel", "INFO", *(FAST if fast else []), *extra]
        own = {**celery_env, "CELERY_ACKS_LATE": "1" if acks_late else "0", **(env or {})}
        command = [sys.executable, "-m", "celery", "-A", "celeryapp", *args]
        worker = children.start(name, command, own, ready=logged_ready)
        return worker.wait_ready() if ready else worker

    return start
