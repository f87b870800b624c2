"""Per task name statistics of Celery apps on this transport: tasks sent, runs finished.

The transport counts each task it publishes (``enqueued``, or ``retried``
for the new message of ``Task.retry``, whose ``retries`` header is above
0; :meth:`.store.Store.write`). In a worker, Celery's ``task_prerun`` and
``task_postrun`` signals time each run in the process that runs it (a
prefork child too) and count it ``done`` (state ``SUCCESS``) or ``failed``
(any other: an exception, a retry, a revocation). Only apps whose broker
is this transport are counted, and only with the transport option
``task_stats`` left on. The counts go to the server every few seconds
(:class:`simplebroker_redis.tasks.TaskStats`).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from celery import signals

from simplebroker_redis import tasks

from .options import TransportOptions, client_target, runner_options

#: The transport's ``driver_name`` (``transport.Transport``).
DRIVER_NAME = "simplebroker-redis"

_started: dict[str, float] = {}
_recorders: dict[tuple[int, int], tasks.TaskStats | None] = {}
_lock = threading.Lock()


def recorder(app: Any) -> tasks.TaskStats | None:
    """Return the task statistics of ``app``'s broker namespace, None when not kept."""
    key = (os.getpid(), id(app))
    with _lock:
        if key in _recorders:
            return _recorders[key]
    found = _make(app)
    with _lock:
        return _recorders.setdefault(key, found)


def _make(app: Any) -> tasks.TaskStats | None:
    connection = app.connection_for_write()
    try:
        # This transport's class, named without importing it (it sits above).
        if getattr(connection.get_transport_cls(), "driver_name", "") != DRIVER_NAME:
            return None
        raw = connection.transport_options or {}
        if not tasks.enabled(TransportOptions.parse(raw).task_stats):
            return None
        runner = client_target(connection).with_options(runner_options(raw)).runner()
        return tasks.task_stats(runner)
    except Exception:  # noqa: BLE001 - statistics never stop a task
        return None
    finally:
        connection.release()


def _prerun(task_id: str | None = None, task: Any = None, **_: Any) -> None:
    if task_id is not None and task is not None and recorder(task.app) is not None:
        _started[task_id] = time.perf_counter()


def _postrun(
    task_id: str | None = None, task: Any = None, state: str | None = None, **_: Any
) -> None:
    started = _started.pop(task_id, None) if task_id is not None else None
    if started is None or task is None:
        return
    stats = recorder(task.app)
    if stats is not None:
        stats.finished(task.name, time.perf_counter() - started, ok=state == "SUCCESS")


def _process_shutdown(**_: Any) -> None:
    # A prefork child ends without atexit: send what it counted first.
    tasks.flush_all()


signals.task_prerun.connect(_prerun, weak=False)
signals.task_postrun.connect(_postrun, weak=False)
signals.worker_process_shutdown.connect(_process_shutdown, weak=False)
