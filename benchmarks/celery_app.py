"""Celery apps under test, the tasks, and the worker-side probes.

Imported by ``celery -A celery_app worker`` (the worker builds its app from
``BENCH_CELERY_*`` environment variables) and by the benchmark process
(producer apps from :func:`make_app`).

Entries (one row of the tables each):

- ``simplebroker``: this package's kombu transport and result backend
  (``simplebroker+redis://``), default options (lease 10 s);
- ``redis``: Celery's own Redis transport and Redis result backend
  (``redis://``), default options (``visibility_timeout`` one hour);
- ``redis-vt10``: the same with ``visibility_timeout = 10`` and the restore
  sweep tuned to run every second (``unacked_restore_interval = 1``,
  ``unacked_restore_throttle = 1``), the fastest recovery it can be set
  to; used only in the recovery measurement.

Both run with ``task_acks_late`` and ``task_reject_on_worker_lost`` (the
settings under which a killed worker's tasks come back at all).

In the worker, signal handlers report ``ready``, ``start <task id>`` and
``done <task id>`` (after the result is stored) over a local TCP socket,
each with the process's CPU time so far; no Redis command. A throughput
worker (``BENCH_REPORT_AT=N``) reports only ``ready`` and ``nth N``, when its
N-th task finished.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from celery import Celery, signals

import celery_simplebroker  # noqa: F401 - registers the "simplebroker" kombu transport


@dataclass(frozen=True)
class Entry:
    """One Celery configuration in the comparison."""

    key: str  #: short id (environment, JSON)
    label: str  #: table row


ENTRIES: tuple[Entry, ...] = (
    Entry("simplebroker", "celery_simplebroker (ours)"),
    Entry("redis", "Celery Redis transport + backend"),
    Entry("redis-vt10", "Celery Redis, visibility_timeout=10, sweep 1 s"),
)

#: The Redis database each entry uses (Celery's Redis keys are not namespaced).
DATABASES = {"simplebroker": 0, "redis": 1, "redis-vt10": 2}


def make_app(entry: str, server_url: str, namespace: str) -> Celery:
    """Return the app of ``entry`` on the server at ``server_url`` (``redis://host:port/0``)."""
    url = f"redis://{urlsplit(server_url).netloc}/{DATABASES[entry]}"
    app = Celery(f"bench-{entry}")
    conf: dict[str, Any] = {
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_hijack_root_logger": False,
        "broker_connection_retry_on_startup": True,
        "result_expires": 3600,
    }
    if entry == "simplebroker":
        conf.update(
            broker_url=f"simplebroker+{url}",
            result_backend=f"simplebroker+{url}",
            broker_transport_options={"namespace": namespace},
            result_backend_transport_options={"namespace": namespace},
        )
    else:
        options: dict[str, Any] = {}
        if entry == "redis-vt10":
            options = {
                "visibility_timeout": 10,
                "unacked_restore_interval": 1,
                "unacked_restore_throttle": 1,
            }
        conf.update(broker_url=url, result_backend=url, broker_transport_options=options)
    app.conf.update(conf)

    @app.task(name="add", shared=False)
    def add(a: int, b: int) -> int:
        return a + b

    @app.task(name="hold", shared=False)
    def hold() -> None:
        time.sleep(float(os.environ.get("BENCH_HOLD", "0")))

    return app


class _Probe:
    """The worker's line to the benchmark process (thread-safe; opened lazily).

    With ``report_at`` (a throughput worker) it reports only the task that
    brings its count of finished tasks to that number, as ``nth``: a line
    per task would cost the worker and the benchmark process (which is also
    the producer) more than the transports' own per-task work it measures.
    """

    def __init__(self, port: int, tag: str, report_at: int | None) -> None:
        self._port = port
        self._tag = tag
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self.report_at = report_at
        self._finished = 0

    def send(self, kind: str, task_id: str = "-") -> None:
        line = f"{self._tag} {kind} {task_id} {time.process_time_ns()}\n".encode()
        with self._lock:
            if self._sock is None:
                self._sock = socket.create_connection(("127.0.0.1", self._port))
            self._sock.sendall(line)

    def finished(self, task_id: str) -> None:
        if self.report_at is None:
            self.send("done", task_id)
            return
        with self._lock:
            self._finished += 1
            count = self._finished
        if count == self.report_at:
            self.send("nth", str(count))


_PROBE = (
    _Probe(
        int(os.environ["BENCH_HUB_PORT"]),
        os.environ["BENCH_TAG"],
        int(os.environ["BENCH_REPORT_AT"]) if os.environ.get("BENCH_REPORT_AT") else None,
    )
    if os.environ.get("BENCH_HUB_PORT")
    else None
)


@signals.worker_ready.connect
def _ready(**kwargs: Any) -> None:
    if _PROBE is not None:
        _PROBE.send("ready")


@signals.task_prerun.connect
def _start(task_id: str = "-", **kwargs: Any) -> None:
    if _PROBE is not None and _PROBE.report_at is None:
        _PROBE.send("start", task_id)


@signals.task_postrun.connect
def _done(task_id: str = "-", **kwargs: Any) -> None:
    # After the result was stored (and before a late acknowledgement).
    if _PROBE is not None:
        _PROBE.finished(task_id)


if os.environ.get("BENCH_CELERY_ENTRY"):
    app = make_app(
        os.environ["BENCH_CELERY_ENTRY"],
        os.environ["BENCH_CELERY_URL"],
        os.environ["BENCH_CELERY_NS"],
    )
