"""SimpleBroker's private helpers that this backend reuses, in one place.

SimpleBroker documents that first-party backends import these private
helpers under the exact ``backend_api_version`` handshake, so input is
rejected with the same exception types and messages as on SQLite. Every such
import lives here, in one place, to make a core upgrade easy to audit.

One more private touch lives here: :func:`guard_connection_retry`. When
SimpleBroker opens a connection for a ``Queue`` (and the ``broker`` CLI's
``write``), it retries *any* failure three times, sleeping 2 s and 4 s, and
does not read ``OperationalError.retryable``: a wrong password took 6 s to
report. The guard lets this backend's errors that no retry can fix
(:class:`~simplebroker_redis.errors.AccessDenied`, the server's answer
:class:`~simplebroker_redis.errors.Rejected`, an invalid target) leave
that loop at once; every other failure (a server not reachable yet) is
retried exactly as before, and other backends' errors are untouched.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import simplebroker.db as _sb_db
from simplebroker._aliases import resolve_queue_operand
from simplebroker._constants import PEEK_BATCH_SIZE, VACUUM_CLAIMED_ABSOLUTE_LIMIT
from simplebroker._exceptions import StopException
from simplebroker._message_id import normalize_message_id
from simplebroker._message_insert import normalize_insert_records
from simplebroker._message_search import (
    BODY_SEARCH_DEFAULT_LIMIT,
    BODY_SEARCH_REDIS_SCAN_CHUNK_SIZE,
    validate_body_contains,
    validate_body_search_limit,
)
from simplebroker._selection import validate_selection_order
from simplebroker._timestamp import validate_timestamp_bound
from simplebroker.db import _ALIAS_SHADOW_WARNING_SUPPRESSED, _AliasShadowsQueueWarning

from .errors import AccessDenied, Rejected
from .targets import InvalidTarget

T = TypeVar("T")

#: Errors of this backend that SimpleBroker's connection retry gives up on at once.
_PERMANENT: tuple[type[BaseException], ...] = (AccessDenied, Rejected, InvalidTarget)


class _AliasShadowWarning:
    """The core's alias-shadows-queue warning and its CLI suppression switch."""

    category = _AliasShadowsQueueWarning

    @staticmethod
    def suppressed() -> bool:
        """Return whether the caller (the CLI) suppressed the warning."""
        return bool(_ALIAS_SHADOW_WARNING_SUPPRESSED.get())


alias_shadow_warning = _AliasShadowWarning()


class _GiveUp(StopException):
    """Carries a permanent error out of SimpleBroker's retry, which never retries a stop."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


def guard_connection_retry() -> bool:
    """Make SimpleBroker's connection-open retry give up at once on permanent errors.

    Returns whether the guard is in place (False when this SimpleBroker has
    no such loop: nothing to guard).
    """
    original: Any = getattr(_sb_db, "_execute_connection_retry", None)  # private: see above
    if original is None:
        return False
    if getattr(original, "_simplebroker_redis_guard", False):
        return True

    @functools.wraps(original)
    def guarded(operation: Callable[[], T], *args: Any, **kwargs: Any) -> T:
        def attempt() -> T:
            try:
                return operation()
            except _PERMANENT as exc:
                raise _GiveUp(exc) from exc

        try:
            result: T = original(attempt, *args, **kwargs)
        except _GiveUp as give_up:
            raise give_up.error from None
        return result

    guarded._simplebroker_redis_guard = True  # type: ignore[attr-defined] # a marker
    # setattr: the module does not export the name, and the wrapper's type is looser.
    setattr(_sb_db, "_execute_connection_retry", guarded)  # noqa: B010
    return True


__all__ = [
    "BODY_SEARCH_DEFAULT_LIMIT",
    "BODY_SEARCH_REDIS_SCAN_CHUNK_SIZE",
    "PEEK_BATCH_SIZE",
    "VACUUM_CLAIMED_ABSOLUTE_LIMIT",
    "alias_shadow_warning",
    "guard_connection_retry",
    "normalize_insert_records",
    "normalize_message_id",
    "resolve_queue_operand",
    "validate_body_contains",
    "validate_body_search_limit",
    "validate_selection_order",
    "validate_timestamp_bound",
]
