"""A task whose lease ran out is not started: checked in the pool process, right before its body.

The worker's event loop checks the leases of the tasks it delivered
(:meth:`.poller.Poller`'s lease check), but a prefork worker hands a task
to a pool process through a pipe, and the pool process starts it when it
reads it: after a stop of the whole worker (SIGSTOP, a frozen VM) longer
than the lease, a pool process resumed with a task in its pipe, or one
handed to it before the event loop's next check, started a task another
worker had taken over meanwhile (issue 42: ``late`` in the nemesis
checker).

So the transport marks each delivered message with its lease's deadline
as last known (:data:`LEASE_UNTIL_FIELD`, this host's monotonic clock,
which every process of the host shares), and in every pool process each
task's tracer (``task.__trace__``, built by Celery in the pool process
before ``worker_process_init``) is wrapped: right before the task's body
would start, a task whose known deadline has passed is checked on the
server, one round trip renewing its reservation (the worker holds it: it
is renewed anyway). A reservation the server no longer knows was taken
over: the task is not started, but rejected with ``requeue`` (Celery then
hands it back, which for a lease taken over changes nothing; the new
holder runs it). A task within its known deadline starts at once, with
no round trip. If the server cannot be reached, the task is handed back
too: it cannot be told whether another worker has it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any, Final

from billiard.einfo import ExceptionInfo
from celery import signals, states
from celery.app.trace import TraceInfo, trace_ok_t
from celery.exceptions import Reject
from simplebroker.ext import OperationalError

from simplebroker_redis import Leases, RedisRunner

from .envelope import parse_tag
from .errors import unreachable
from .fencing import HOLDER_FIELD, holder_mark
from .options import client_target, runner_options

logger = logging.getLogger("celery_simplebroker")

#: Message property: the lease's deadline as known at delivery (``time.monotonic()`` s).
LEASE_UNTIL_FIELD: Final[str] = "x-simplebroker-lease-until"

#: Seconds the check waits for the server (connect, reply).
CHECK_TIMEOUT: Final[float] = 5.0

#: Marks a tracer this module wrapped.
_GUARDED: Final[str] = "_simplebroker_guarded"

_runners: dict[tuple[int, int], tuple[RedisRunner, str] | None] = {}
_lock = threading.Lock()


def stamp(properties: dict[str, Any], until: float | None) -> None:
    """Mark a delivered message's ``properties`` with its lease's known deadline (or nothing)."""
    if until is not None:
        properties[LEASE_UNTIL_FIELD] = until


def _runner(app: Any) -> tuple[RedisRunner, str] | None:
    """Return this process's runner of ``app``'s broker namespace and its mark, None if not ours."""
    key = (os.getpid(), id(app))
    with _lock:
        if key in _runners:
            return _runners[key]
    found: tuple[RedisRunner, str] | None = None
    connection = app.connection_for_write()
    try:
        raw = connection.transport_options or {}
        runner = client_target(connection).with_options(runner_options(raw)).runner()
        found = (runner.sibling(CHECK_TIMEOUT), holder_mark(runner.identity))
    except Exception:  # noqa: BLE001 - not this transport's URL: nothing to check
        found = None
    finally:
        connection.release()
    with _lock:
        return _runners.setdefault(key, found)


def startable(app: Any, request: dict[str, Any] | None) -> Reject | None:
    """Return None when the task of ``request`` may start; else why not, as a ``Reject``."""
    properties = (request or {}).get("properties") or {}
    until = properties.get(LEASE_UNTIL_FIELD)
    tag = properties.get("delivery_tag")
    if not isinstance(until, float) or time.monotonic() < until or not isinstance(tag, str):
        return None
    found = _runner(app)
    if found is None or properties.get(HOLDER_FIELD) != found[1]:
        return None
    try:
        token, message_id = parse_tag(tag)
        renewal = Leases(found[0]).renewal([token])
    except ValueError:  # not this transport's tag
        return None
    except OperationalError as exc:
        if not unreachable(exc):
            raise
        logger.warning(
            "message %s is not started: its lease's known deadline passed while it waited "
            "for a pool process, and the server cannot be reached to tell whether it is "
            "still this worker's (%s); it is handed back",
            tag,
            exc,
        )
        return Reject(exc, requeue=True)
    if token not in renewal.lost:
        return None
    logger.warning(
        "message %d is not started: its lease ran out while it waited for a pool process "
        "(was this worker stopped longer than the lease?) and another worker has it now",
        message_id,
    )
    return Reject("lease taken over", requeue=True)


def _rejected(reason: Reject) -> Any:
    """Return what Celery's tracer returns for a task that raised ``reason`` (a ``Reject``)."""
    try:
        raise reason
    except Reject:
        einfo = ExceptionInfo(internal=True)
    return trace_ok_t(einfo, TraceInfo(states.REJECTED, reason), 0.0, None)


def guard(app: Any, trace: Callable[..., Any]) -> Callable[..., Any]:
    """Return ``trace`` (a task's tracer) that first checks the task's lease (:func:`startable`)."""

    def guarded(uuid: str, args: Any, kwargs: Any, request: dict[str, Any] | None = None) -> Any:
        refused = startable(app, request)
        if refused is not None:
            return _rejected(refused)
        return trace(uuid, args, kwargs, request)

    setattr(guarded, _GUARDED, True)
    return guarded


def _process_init(**_: Any) -> None:
    """In a new pool process: wrap the tracer of every task of the current app."""
    from celery import current_app

    app = current_app._get_current_object()
    for task in list(app.tasks.values()):
        trace = getattr(task, "__trace__", None)
        if trace is not None and not getattr(trace, _GUARDED, False):
            task.__trace__ = guard(app, trace)


signals.worker_process_init.connect(_process_init, weak=False)
