"""Errors of the Taskiq integration, and which storage failures are transient.

Every error raised here inherits both Taskiq's ``TaskiqError`` and
SimpleBroker's ``BrokerError``, so callers can catch either family. Storage
failures keep the types :mod:`simplebroker_redis` translates them to
(``OperationalError`` and friends); :func:`is_transient` tells the retry
loops which of them a later attempt can fix.
"""

from __future__ import annotations

import redis.exceptions as rx
from simplebroker.ext import BrokerError, MessageError, OperationalError
from taskiq.exceptions import ResultGetError, SendTaskError, TaskiqError

from simplebroker_redis import AccessDenied, OutcomeUnknown, ReplicationTimeout

# The backend's reconnect backoff bounds serve every retry loop here too.
from simplebroker_redis.retry import BACKOFF_MAX, BACKOFF_MIN

__all__ = [
    "BACKOFF_MAX",
    "BACKOFF_MIN",
    "ConfigurationError",
    "LabelError",
    "MessageTooLargeError",
    "ResultIsMissingError",
    "ScheduleError",
    "SimpleBrokerTaskiqError",
    "TaskOutcomeUnknown",
    "is_transient",
]


class SimpleBrokerTaskiqError(TaskiqError, BrokerError):
    """Base class of this package's errors (a Taskiq and a SimpleBroker error).

    Every subclass declares its own ``__init__(detail)``: Taskiq's errors are
    dataclass-like (``dataclass_transform``), so a type checker gives a
    subclass without one a keyword-only ``__init__`` of its fields, and
    ``ConfigurationError("...")`` would not type-check.
    """

    __template__ = "{detail}"
    detail: str

    def __init__(self, detail: str) -> None:
        super().__init__(detail=detail)


class ConfigurationError(SimpleBrokerTaskiqError, ValueError):
    """An option of the broker, result backend or schedule source is invalid."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)


class LabelError(ConfigurationError, SendTaskError):
    """A task's label cannot be honoured (``queue_name``, ``priority``, ``delay``).

    Raised by ``kiq()`` before anything is sent, with the reason in its own
    message (Taskiq wraps what the broker's ``kick`` raises into a bare
    ``SendTaskError: Cannot send task to the queue``). Still a
    ``SendTaskError``, so code catching that keeps working.
    """

    def __init__(self, detail: str) -> None:
        super().__init__(detail)


class MessageTooLargeError(SimpleBrokerTaskiqError, SendTaskError, MessageError):
    """A task's message is larger than ``BROKER_MAX_MESSAGE_SIZE``: ``kiq()`` sends nothing.

    A ``SendTaskError`` (as Taskiq raises for a failed send) and SimpleBroker's
    ``MessageError`` (as ``broker write`` raises for the same message), with
    the sizes and the setting in its message.
    """

    def __init__(self, detail: str) -> None:
        super().__init__(detail)


class ResultIsMissingError(SimpleBrokerTaskiqError, ResultGetError):
    """No result is stored for the task (not finished, expired, or consumed)."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)


class ScheduleError(SimpleBrokerTaskiqError, ValueError):
    """A schedule cannot be stored (for example an unparsable cron expression)."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)


class EvictionPolicyError(ConfigurationError):
    """The server may evict the namespace's keys (``maxmemory-policy allkeys-*``)."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)


class DeadLetteredError(SimpleBrokerTaskiqError):
    """The task went to the dead-letter queue without finishing (its error result)."""

    # One positional argument, so Taskiq rebuilds it from a stored result.
    def __init__(self, detail: str) -> None:
        super().__init__(detail)


def check_dedupe_seconds(value: object) -> float | None:
    """Return a broker's ``dedupe_seconds`` (None: off); raise ``ConfigurationError`` if invalid."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0.001:
        raise ConfigurationError("dedupe_seconds must be a number >= 0.001, or None")
    return float(value)


class TaskOutcomeUnknown(SimpleBrokerTaskiqError, OutcomeUnknown):
    """A task was sent, but the reply never came: it may or may not be queued.

    ``kiq()`` raises Taskiq's ``SendTaskError`` from it. The write left
    this process, then its reply timed out (``socket_timeout``, 10 s by
    default) or the connection broke: the server may have stored the task,
    or may still store it when the network delivers the request late.
    Sending the same task again (same task ID and arguments:
    ``task.kicker().with_task_id(error.task_id).kiq(...)``) within the
    broker's ``dedupe_seconds`` never stores a second copy.
    """

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.task_id = ""

    @classmethod
    def of(
        cls, task_id: str, dedupe_seconds: float | None, cause: OutcomeUnknown
    ) -> TaskOutcomeUnknown:
        """Return the error of task ``task_id``'s write whose outcome ``cause`` left unknown."""
        if dedupe_seconds is None:
            advice = "this broker has dedupe_seconds=None: a resend may store it twice"
        else:
            advice = (
                f"sending it again with the same task ID and arguments within "
                f"{dedupe_seconds:g} s (task.kicker().with_task_id({task_id!r}).kiq(...)) "
                "stores no second copy"
            )
        error = cls(f"task {task_id} may or may not have been queued ({cause}); {advice}")
        error.task_id = task_id
        return error


_TRANSIENT_CAUSES = (rx.ConnectionError, rx.TimeoutError, rx.ReadOnlyError, OSError)


def is_transient(exc: BaseException) -> bool:
    """Return True when retrying later can succeed (server restarting, busy, unreachable).

    ``simplebroker_redis`` marks connection failures as not retryable for
    writes in general, because a lost reply may hide a committed write. The
    callers of this function only retry operations that are safe to repeat
    (a new reservation, settling the same IDs again, renewing leases).
    """
    if isinstance(exc, AccessDenied):
        # A refused password, an ACL denial, a failed TLS handshake: waiting
        # would only hide it (the backend says so; the cause may be a
        # ConnectionError, which alone would look transient).
        return False
    if isinstance(exc, OperationalError):
        # ReplicationTimeout (wait_replicas): the operation happened but is not
        # replicated yet; the operations retried here may be repeated.
        if exc.retryable or isinstance(exc, ReplicationTimeout):
            return True
        exc = exc.__cause__ if exc.__cause__ is not None else exc
    # A refused password (redis-py's AuthenticationError is a ConnectionError)
    # does not fix itself: waiting would only hide it.
    if isinstance(exc, rx.AuthenticationError):
        return False
    return isinstance(exc, _TRANSIENT_CAUSES)
