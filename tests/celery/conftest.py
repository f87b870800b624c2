"""Fixtures for the Celery integration: the test app and real ``celery worker`` processes."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cehelpers import PYTHONPATH, CeleryWorker

from simplebroker_redis.devserver import DevServer

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
        "PYTHONPATH": PYTHONPATH,
        "SIMPLEBROKER_REDIS_URL": celery_url,
        "CELERY_NS": namespace,
        "CELERY_LOG": str(events),
        "CELERY_LEASE": str(lease),
    }


@pytest.fixture
def start_worker(
    celery_env: dict[str, str], events: Path, tmp_path: Path
) -> Iterator[Callable[..., CeleryWorker]]:
    """Start ``celery worker`` processes (``-P solo`` by default); all are killed afterwards."""
    started: list[CeleryWorker] = []

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
    ) -> CeleryWorker:
        args = ["worker", "-P", pool, "-c", str(concurrency), "-n", f"{name}@%h", "-Q", queues]
        args += ["--loglevel", "INFO", *(FAST if fast else []), *extra]
        own = {**celery_env, "CELERY_ACKS_LATE": "1" if acks_late else "0", **(env or {})}
        worker = CeleryWorker(name, args, own, tmp_path / f"{name}-{len(started)}.out")
        started.append(worker)
        return worker.wait_ready(events) if ready else worker

    yield start
    for worker in started:
        worker.kill()


@pytest.fixture
def make_server(tmp_path: Path) -> Iterator[Callable[..., DevServer]]:
    """Factory of private servers a test may stop and restart (same name: same data dir)."""
    servers: list[DevServer] = []

    def factory(name: str = "srv", **kwargs: Any) -> DevServer:
        server = DevServer(data_dir=str(tmp_path / name), **kwargs)
        servers.append(server)
        return server.start()

    yield factory
    for server in servers:
        try:
            server.stop()
        except Exception:  # noqa: BLE001 - teardown must stop every server
            pass
