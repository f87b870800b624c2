"""The Celery app of the integration tests (imported by workers and by the tests).

Configured from the environment a test gives its worker processes:
``SIMPLEBROKER_REDIS_URL``, ``CELERY_NS`` (namespace), ``CELERY_LOG`` (the
event log, ``support.eventlog``, that tasks and signals note events in),
``CELERY_LEASE`` (lease seconds), ``CELERY_ACKS_LATE`` (``0``: Celery's
default, acknowledge when a task starts), ``CELERY_BEAT`` (seconds between
the ``record beat`` tasks of a beat schedule), ``CELERY_CONF`` (JSON: more
Celery settings, applied last).
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
import time
from typing import Any

from celery import Celery, signals

import celery_simplebroker  # noqa: F401 - registers the "simplebroker" transport
from support.eventlog import note


def make_app(
    url: str,
    namespace: str,
    log: str,
    lease: float = 10.0,
    acks_late: bool = True,
    durability: dict[str, float] | None = None,
) -> Celery:
    app = Celery("celeryapp")
    options = {
        "namespace": namespace,
        "lease_seconds": lease,
        "heartbeat_interval": min(2.0, lease / 4),
        "recover_interval": min(1.0, lease / 4),
        **(durability or {}),
    }
    app.conf.update(
        broker_url=f"simplebroker+{url}",
        result_backend=f"simplebroker+{url}",
        broker_transport_options=options,
        result_backend_transport_options={"namespace": namespace, **(durability or {})},
        task_acks_late=acks_late,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=2,
        result_backend_always_retry=True,
        result_backend_max_retries=50,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        worker_lost_wait=1.0,  # prefork: declare a killed pool process lost after 1 s
    )
    register_tasks(app, log)
    return app


def register_tasks(app: Celery, log: str) -> None:  # noqa: C901 - one task per function
    @app.task(shared=False, name="add")
    def add(a: int, b: int) -> int:
        return a + b

    @app.task(shared=False, name="tsum")
    def tsum(values: list[int]) -> int:
        return sum(values)

    @app.task(shared=False, name="mul")
    def mul(a: int, b: int) -> int:
        return a * b

    @app.task(shared=False, name="record", bind=True)
    def record(self: Any, key: str, seconds: float = 0.0) -> str:
        note(log, "start", key, self.request.hostname)
        if seconds:
            time.sleep(seconds)
        note(log, "done", key, self.request.hostname)
        return key

    @app.task(shared=False, name="witness")
    def witness(key: str, seconds: float) -> list[object]:
        """Work ``seconds``; return the key and this pool process's pid (who wrote the result)."""
        note(log, "start", key)
        time.sleep(seconds)
        note(log, "done", key)
        return [key, os.getpid()]

    @app.task(shared=False, name="flaky", bind=True, max_retries=5)
    def flaky(self: Any, key: str, failures: int, countdown: float) -> str:
        note(log, "try", key, self.request.retries)
        if self.request.retries < failures:
            raise self.retry(countdown=countdown)
        return f"{key}:{self.request.retries}"

    @app.task(shared=False, name="identity")
    def identity(value: Any) -> Any:
        return value

    @app.task(shared=False, name="add_to_own_chord", bind=True)
    def add_to_own_chord(self: Any, values: list[int]) -> int:
        """Add one task per value to this task's chord (the body waits for them too)."""
        for value in values:
            self.add_to_chord(app.signature("add", (value, 1)))
        return 0

    @app.task(shared=False, name="collect")
    def collect(keys: list[str]) -> list[str]:
        note(log, "body", len(keys))
        return sorted(keys)

    @app.task(shared=False, name="die_after_result")
    def die_after_result(key: str) -> str:
        note(log, "run", key)
        return key  # the task_success handler below kills this worker

    @app.task(shared=False, name="boom")
    def boom() -> None:
        raise ValueError("boom")

    @app.task(shared=False, name="capped", time_limit=1)
    def capped(key: str, seconds: float) -> str:
        """Outlive the hard time limit (prefork kills the pool process)."""
        note(log, "start", key)
        time.sleep(seconds)
        return key

    @app.task(shared=False, name="whoami", bind=True)
    def whoami(self: Any, key: str, seconds: float = 0.0) -> str:
        """``record``, returning who ran it: ``<key> <hostname> <pid>``."""
        note(log, "start", key, self.request.hostname)
        if seconds:
            time.sleep(seconds)
        note(log, "done", key, self.request.hostname)
        return f"{key} {self.request.hostname} {os.getpid()}"


def _signal_event(*words: object) -> None:
    """Append a worker signal's event to ``$CELERY_LOG`` (a test worker has one)."""
    log = os.environ.get("CELERY_LOG")
    if log:
        note(log, *words)


@signals.worker_ready.connect
def _ready(sender: Any = None, **kwargs: Any) -> None:
    """The worker consumes; the event names its loop (Celery's hub or its blocking loop)."""
    loop = "hub" if getattr(sender, "hub", None) is not None else "blocking"
    pool = type(getattr(getattr(sender, "pool", None), "_pool", None)).__name__
    _signal_event("ready", getattr(sender, "hostname", "?"), loop, pool)


@signals.worker_shutting_down.connect
def _stopping(sender: Any = None, **kwargs: Any) -> None:
    """The shutdown begins (Celery's SIGTERM handler)."""
    _signal_event("stopping", sender or "?")


@signals.worker_shutdown.connect
def _stopped(sender: Any = None, **kwargs: Any) -> None:
    """The consumer and the pool have stopped; what is left is the interpreter's exit.

    A process still alive 3 s later writes every thread's stack to its
    output (the tests show it when an exit is slow).
    """
    _signal_event("stopped", getattr(sender, "hostname", "?"))
    if os.environ.get("CELERY_LOG") and sys.__stderr__ is not None:
        faulthandler.dump_traceback_later(3.0, file=sys.__stderr__)


@signals.task_success.connect
def _die_after_result(sender: Any = None, **kwargs: Any) -> None:
    """Kill this worker once ``die_after_result``'s result is stored, before Celery acks it."""
    if getattr(sender, "name", None) == "die_after_result":
        os.kill(os.getpid(), signal.SIGKILL)


@signals.task_received.connect
def _received(request: Any = None, **kwargs: Any) -> None:
    if request is not None:
        _signal_event("received", request.id, request.eta or "-")


if os.environ.get("CELERY_NS"):
    app = make_app(
        os.environ["SIMPLEBROKER_REDIS_URL"],
        os.environ["CELERY_NS"],
        os.environ["CELERY_LOG"],
        float(os.environ.get("CELERY_LEASE", "10")),
        os.environ.get("CELERY_ACKS_LATE", "1") == "1",
        {
            "wait_replicas": int(os.environ["CELERY_WAIT_REPLICAS"]),
            "wait_timeout": float(os.environ.get("CELERY_WAIT_TIMEOUT", "1.0")),
        }
        if os.environ.get("CELERY_WAIT_REPLICAS")
        else None,
    )
    if os.environ.get("CELERY_CONF"):
        app.conf.update(json.loads(os.environ["CELERY_CONF"]))
    if os.environ.get("CELERY_BEAT"):  # seconds between two "record beat" tasks (-B)
        app.conf.beat_schedule = {
            "beat": {
                "task": "record",
                "schedule": float(os.environ["CELERY_BEAT"]),
                "args": ("beat",),
            }
        }
