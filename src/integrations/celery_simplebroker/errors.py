"""Errors the transport raises to Celery: connection failures in redis-py's types, and publishes.

kombu and Celery retry a transport's ``connection_errors`` (Celery's
broker-connection retry at startup, ``ensure_connection``, a producer's
``retry``). The backend raises SimpleBroker's ``OperationalError`` for any
connection failure, with redis-py's exception as its cause; at connect time
the transport raises it again as one of the classes below, each both an
``OperationalError`` and the redis-py type Celery users and kombu's tests
catch with Celery's Redis transport (``redis.AuthenticationError``,
``redis.TimeoutError``, ``redis.ConnectionError``). The message is the
backend's (the password never in it).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import redis
from simplebroker.ext import OperationalError

from simplebroker_redis import AccessDenied, ReplicationTimeout


class UnconfirmedPublish(RuntimeError):
    """A message was written, but too few replicas confirmed it (``wait_replicas``).

    Its cause is the backend's ``ReplicationTimeout``. It is deliberately
    not one of the transport's connection errors: kombu retries a publish
    that raised one of those (Celery's ``task_publish_retry``, on by
    default), and the message, already in its queue, would be sent a
    second time and could run twice at once.
    """


class LeasesRanOut(OperationalError):
    """Tasks Celery holds, delivered but not finished, lost their leases to another worker.

    The worker was stopped, or cut off from the server, for longer than the
    lease: another worker runs those tasks now. Raised in the worker's event
    loop as a connection error, so that Celery restarts its consumer, which
    drops the tasks its pool had not started yet (instead of starting them
    a second time); the tasks running meanwhile finish, and their results
    are fenced (:mod:`.fencing`).
    """

    def __init__(self, lost: int) -> None:
        super().__init__(
            f"{lost} reservation(s) of tasks delivered to this worker and not finished were "
            "taken over by another worker (was this worker stopped, or cut off from the "
            "server, longer than the lease?): restarting the consumer, so that those not "
            "started yet are not started here"
        )


class AuthenticationFailed(AccessDenied, redis.AuthenticationError):
    """The server refused the user name or password, or wanted one (a connection error).

    Also the backend's ``AccessDenied``: kombu and Celery retry it as they
    retry a wrong password on their Redis transport (each try logs it at
    once), while code that catches the backend's refusals still sees one.
    """


class ConnectTimedOut(OperationalError, redis.TimeoutError):
    """Connecting to the server timed out."""


class ServerUnreachable(OperationalError, redis.ConnectionError):
    """The server could not be reached (refused, unresolvable, TLS verification failed)."""


def unreachable(exc: BaseException) -> bool:
    """Return True when ``exc`` is the backend's "cannot reach the server" (any cause).

    A connection refused, reset, closed or timed out: the call may be made
    again once the server is back. Not a refusal no retry can fix
    (``AccessDenied``), nor a write that happened (``ReplicationTimeout``).
    """
    if not isinstance(exc, OperationalError) or isinstance(exc, (AccessDenied, ReplicationTimeout)):
        return False
    return isinstance(exc.__cause__, (redis.ConnectionError, redis.TimeoutError, OSError))


def unsent(exc: BaseException) -> bool:
    """Return True when ``exc`` says the command never left this process (a failed connect).

    The backend marks those ``retryable``: nothing reached the server. Any
    other connection failure (a read that timed out, a reset after the
    send) leaves the command's outcome unknown.
    """
    return unreachable(exc) and bool(getattr(exc, "retryable", False))


@contextmanager
def typed_connection_errors() -> Iterator[None]:
    """Raise a connection failure of the backend as the matching class above."""
    try:
        yield
    except OperationalError as exc:
        cause = exc.__cause__
        typed: type[OperationalError] | None = None
        if isinstance(cause, redis.AuthenticationError):
            typed = AuthenticationFailed
        elif isinstance(cause, redis.TimeoutError):
            typed = ConnectTimedOut
        elif isinstance(cause, (redis.ConnectionError, OSError)):
            typed = ServerUnreachable
        if typed is None or isinstance(exc, typed):
            raise
        error = typed(str(exc))
        error.retryable = getattr(exc, "retryable", False)
        raise error from cause
