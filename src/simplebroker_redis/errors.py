"""The one boundary where driver and script errors become SimpleBroker errors.

Scripts raise ``SBR_<CODE> <detail>``; redis-py raises its own exception
tree. :func:`translate` maps both onto SimpleBroker's exception types and
marks which failures are safe to retry (``OperationalError.retryable``).
Nothing here ever formats a password: callers pass a redacted target.
"""

from __future__ import annotations

import re
from typing import Final

import redis.exceptions as rx
from simplebroker.ext import (
    BrokerError,
    DatabaseError,
    DataError,
    IntegrityError,
    OperationalError,
    TimestampError,
)

# Pipelines prefix the server's reply ("Command # 2 (ZCARD ...) ...: WRONGTYPE").
_WRONGTYPE_RE: Final = re.compile(r"(?:^|: )WRONGTYPE")

# redis-py's wording for a connection that could not be opened: nothing was
# sent, so retrying cannot repeat a command.
_CONNECT_FAILED_RE: Final = re.compile(r"(?i)(?:error [-\d]+ )?connecting to|connection refused")

_SCRIPT_ERROR_RE: Final = re.compile(
    r"^SBR_([A-Z]+) ?(.*?)(?: script: [0-9a-f]+, on @user_script:\d+\.)?$", re.S
)


class ScriptConflict(Exception):
    """Internal: a script refused to allocate an ID (retry is safe).

    Raised before the script wrote anything, so retrying cannot double-apply.
    """

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail


class ReservationConflict(OperationalError):
    """An operation would touch messages held by a live reservation.

    Retryable: once the reservation is settled, released or recovered, the
    same operation can succeed.
    """

    retryable = True


class ReservationLost(OperationalError):
    """A reservation expired and was recovered before it was settled.

    Its messages are pending again and may be delivered a second time, which
    at-least-once delivery allows; the holder should stop working on them.
    """

    retryable = False


class NamespaceMissing(DatabaseError):
    """The namespace has no meta record (never created, or cleaned up)."""


def _operational(message: str, *, retryable: bool) -> OperationalError:
    error = OperationalError(message)
    error.retryable = retryable
    return error


def script_error(code: str, detail: str, where: str) -> BaseException:
    """Map a script's ``SBR_`` error code onto a SimpleBroker exception."""
    if code in ("CLOCK", "IDCONFLICT"):
        return ScriptConflict(code, detail)
    if code == "IDRANGE":
        return TimestampError(detail)
    if code == "DUPLICATE":
        return IntegrityError(f"message ID {detail} already exists")
    if code == "DUPCANDIDATE":
        return IntegrityError(f"the ID generator proposed {detail} twice or out of order")
    if code == "RESERVED":
        return ReservationConflict(detail)
    if code in ("EXISTS", "ALIAS", "ARG"):
        return ValueError(detail)
    if code in ("WRONGTYPE", "CORRUPT"):
        return DataError(f"damaged simplebroker-redis data in {where}: {detail}")
    if code == "UNINITIALIZED":
        return NamespaceMissing(
            f"{where} is not an initialized simplebroker-redis namespace "
            "(run initialize_target or any broker command to create it)"
        )
    if code in ("FOREIGN", "SCHEMA"):
        return DatabaseError(
            f"{where} is not a simplebroker-redis namespace of schema version 1: {detail}"
        )
    return _operational(f"simplebroker-redis script failed ({code}): {detail}", retryable=False)


def _translate_response(exc: rx.ResponseError, where: str) -> BaseException:
    match = _SCRIPT_ERROR_RE.match(str(exc))
    if match:
        return script_error(match.group(1), match.group(2), where)
    text = str(exc)
    if _WRONGTYPE_RE.search(text):
        return DataError(f"damaged simplebroker-redis data in {where}: {text}")
    if text.startswith(("BUSY", "LOADING", "TRYAGAIN", "MASTERDOWN")):
        return _operational(f"Redis at {where} is busy: {text}", retryable=True)
    if isinstance(exc, rx.NoPermissionError) or text.startswith("NOPERM"):
        return _operational(f"Redis at {where} denied access: {text}", retryable=False)
    return _operational(f"Redis at {where} rejected a command: {text}", retryable=False)


def translate(exc: BaseException, where: str) -> BaseException:
    """Return the SimpleBroker exception for a redis-py exception.

    ``where`` names the redacted target and namespace for the message.
    """
    if isinstance(exc, (BrokerError, ScriptConflict)):
        return exc
    if isinstance(exc, rx.ResponseError):
        return _translate_response(exc, where)
    if isinstance(exc, rx.AuthenticationError):
        return _operational(f"cannot authenticate to Redis at {where}: {exc}", retryable=False)
    if isinstance(exc, rx.BusyLoadingError):
        return _operational(f"Redis at {where} is loading data: {exc}", retryable=True)
    if isinstance(exc, rx.ConnectionError) and str(exc) == "No connection available.":
        error = _operational(
            f"Redis connection pool for {where} is exhausted: no connection became "
            "free within pool_timeout (raise backend option max_connections or "
            "pool_timeout)",
            retryable=True,
        )
        error._connection_capacity = True
        return error
    if isinstance(exc, (rx.ConnectionError, rx.TimeoutError, OSError)):
        return _operational(
            f"cannot reach Redis at {where}: {type(exc).__name__}: {exc}",
            retryable=bool(_CONNECT_FAILED_RE.search(str(exc))),
        )
    if isinstance(exc, rx.RedisError):
        return _operational(f"Redis error at {where}: {exc}", retryable=False)
    return exc
