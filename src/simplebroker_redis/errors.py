"""The one boundary where driver and script errors become SimpleBroker errors.

Scripts raise ``SBR_<CODE> <detail>``; redis-py raises its own exception
tree. :func:`translate` maps both onto SimpleBroker's exception types and
marks which failures are safe to retry (``OperationalError.retryable``).
Nothing here ever formats a password: callers pass a redacted target.
"""

from __future__ import annotations

import re
import ssl
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import redis.exceptions as rx
from simplebroker.ext import (
    BrokerError,
    DatabaseError,
    DataError,
    IntegrityError,
    OperationalError,
    TimestampError,
)

from .keys import SCHEMA_VERSION
from .scripts import locate
from .tlsprobe import found_mismatch

# Pipelines prefix the server's reply ("Command # 2 (ZCARD ...) ...: WRONGTYPE").
_WRONGTYPE_RE: Final = re.compile(r"(?:^|: )WRONGTYPE")

# redis-py's wording for a connection that could not be opened: nothing was
# sent, so retrying cannot repeat a command.
_CONNECT_FAILED_RE: Final = re.compile(
    r"(?i)(?:error [-\d]+ )?connecting to|connection refused|previous master is now a slave|"
    r"no master found"
)

_SCRIPT_ERROR_RE: Final = re.compile(
    r"^SBR_([A-Z]+) ?(.*?)(?: script: \w+, on @user_\w+:\d+\.)?$", re.S
)
# The server's words for "no password was given" (HELLO/AUTH handshake, any command).
_AUTH_REQUIRED_RE: Final = re.compile(
    r"(?i)must be called with the client already authenticated|NOAUTH|authentication required"
)

_SCRIPT_SHA_RE: Final = re.compile(r"script: (\w+)")

#: Functions of ``ssl`` (and redis-py's TLS connection) that read certificates and keys.
_TLS_SETUP_FRAMES: Final[frozenset[str]] = frozenset(
    {"load_verify_locations", "load_cert_chain", "_wrap_socket_with_ssl", "create_default_context"}
)
_USER_SCRIPT_RE: Final = re.compile(r"user_(?:script|function):(\d+)")


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


class AccessDenied(OperationalError):
    """The server refused this client, and no retry can change that.

    A missing or wrong password, an ACL denial (``NOPERM``), a TLS handshake
    that failed (certificate verification, a plain port), TLS files that
    cannot be read. Never retryable: SimpleBroker's connection loop and the
    Taskiq and Celery start-ups give up at once instead of waiting.
    """

    retryable = False


class Rejected(OperationalError):
    """The server answered a command with an error no retry changes.

    An answer, not an outage (``DB index is out of range``, ``MISCONF``...):
    SimpleBroker's connection loop gives up at once, as for
    :class:`AccessDenied`. Not retryable.
    """

    retryable = False


class ReservationLost(OperationalError):
    """A reservation expired and was recovered before it was settled.

    Its messages are pending again and may be delivered a second time, which
    at-least-once delivery allows; the holder should stop working on them.
    """

    retryable = False


class ReplicationTimeout(OperationalError):
    """A state change happened, but too few replicas (or AOF fsyncs) confirmed it in time.

    Raised with backend options ``wait_replicas``/``wait_aof`` when WAIT or
    WAITAOF, pipelined after the script on its connection, returns fewer
    acknowledgements than asked within ``wait_timeout``. The write is on the
    primary and may well be kept; but a failover before it reaches a replica
    loses it. Not retryable: repeating a write that happened would apply it
    twice. Read the state back (after a failover if one follows) to decide.

    ``result`` is the operation's parsed reply (what it did on the primary),
    or None when there is none to give: a reservation's caller learns which
    messages it reserved, so it can hand them back rather than strand them
    until their lease expires.
    """

    retryable = False

    def __init__(self, message: str, result: Any = None) -> None:
        super().__init__(message)
        self.result = result


class OutcomeUnknown(OperationalError):
    """A state change was sent, but its reply never came: it may or may not have happened.

    The command left this client (the connection was open and the request
    written), then the reply timed out (``socket_timeout``, 10 s by
    default) or the connection broke. The server may have applied it, may
    still apply it (a request held by the network is delivered after it
    heals), or never received it. Not retryable as such: repeating the
    change could apply it twice. A write that carries an idempotency key
    (a Taskiq task ID, a Protean message ID: see ``dedupe_key``) can be
    sent again with the same key, which never stores a second copy; for
    anything else, read the state back to decide.
    """

    retryable = False


class WrongType(DataError):
    """A command met a key of the wrong Redis type (the server's WRONGTYPE).

    The server does not say which key; the runners look (one read) and
    raise a ``DataError`` naming it (see ``runner.Attempt``).
    """


class NamespaceMissing(DatabaseError):
    """The namespace has no meta record (never created, or cleaned up)."""


def _operational(message: str, *, retryable: bool) -> OperationalError:
    error = OperationalError(message)
    error.retryable = retryable
    return error


def _namespace_missing(detail: str, where: str) -> BaseException:
    return NamespaceMissing(
        f"{where} is not an initialized simplebroker-redis namespace "
        "(run initialize_target or any broker command to create it)"
    )


def _not_ours(detail: str, where: str) -> BaseException:
    return DatabaseError(
        f"{where} is not a simplebroker-redis namespace of schema version "
        f"{SCHEMA_VERSION}: {detail}"
    )


def _damaged(detail: str, where: str) -> BaseException:
    return DataError(f"damaged simplebroker-redis data in {where}: {detail}")


def _retry_later(detail: str, where: str) -> BaseException:
    return _operational(f"reservation failed in {where}: {detail}", retryable=True)


@dataclass(frozen=True, slots=True)
class ScriptErrorCode:
    """One ``SBR_<CODE>`` a script may raise: what it means, and what callers get."""

    meaning: str
    build: Callable[[str, str], BaseException]  #: (detail, where) -> exception


#: Every error code a Lua script raises (``fail('<CODE>', detail)`` sends
#: ``SBR_<CODE> <detail>``). ``tests/test_lua_modules.py`` checks that the
#: scripts raise no other code.
SCRIPT_ERRORS: Final[dict[str, ScriptErrorCode]] = {
    "UNINITIALIZED": ScriptErrorCode(
        "the namespace has no meta record; NamespaceMissing (the runner initializes "
        "the namespace and retries once)",
        _namespace_missing,
    ),
    "FOREIGN": ScriptErrorCode(
        "meta belongs to something else, or keys exist without meta; DatabaseError", _not_ours
    ),
    "SCHEMA": ScriptErrorCode("the stored schema version is not ours; DatabaseError", _not_ours),
    "WRONGTYPE": ScriptErrorCode("a fixed key holds the wrong Redis type; DataError", _damaged),
    "CORRUPT": ScriptErrorCode(
        "a message without a body, a damaged record, count or high-water; DataError", _damaged
    ),
    "CLOCK": ScriptErrorCode(
        "the logical counter at the high-water is exhausted; the client waits for its "
        "clock and retries (internal ScriptConflict)",
        lambda detail, where: ScriptConflict("CLOCK", detail),
    ),
    "IDCONFLICT": ScriptErrorCode(
        "a candidate ID names a stored message; the client backs off and retries "
        "(internal ScriptConflict)",
        lambda detail, where: ScriptConflict("IDCONFLICT", detail),
    ),
    "IDRANGE": ScriptErrorCode(
        "an ID would reach 2**63; TimestampError", lambda detail, where: TimestampError(detail)
    ),
    "DUPLICATE": ScriptErrorCode(
        "an exact-ID insert names a stored message; IntegrityError",
        lambda detail, where: IntegrityError(f"message ID {detail} already exists"),
    ),
    "DUPCANDIDATE": ScriptErrorCode(
        "candidate IDs not strictly increasing (a broken generator); IntegrityError",
        lambda detail, where: IntegrityError(
            f"the ID generator proposed {detail} twice or out of order"
        ),
    ),
    "RESERVED": ScriptErrorCode(
        "the operation would touch reserved messages; ReservationConflict (retryable)",
        lambda detail, where: ReservationConflict(detail),
    ),
    "TOKEN": ScriptErrorCode(
        "a new reservation's token is already in use; OperationalError (retryable: a "
        "new call draws a new token)",
        _retry_later,
    ),
    "EXISTS": ScriptErrorCode(
        "the target queue of a rename exists; ValueError", lambda detail, where: ValueError(detail)
    ),
    "ALIAS": ScriptErrorCode(
        "an alias change would break the flat alias map; ValueError",
        lambda detail, where: ValueError(detail),
    ),
    "ARG": ScriptErrorCode(
        "malformed arguments (a bug in the caller); ValueError",
        lambda detail, where: ValueError(detail),
    ),
}


def script_error(code: str, detail: str, where: str) -> BaseException:
    """Map a script's ``SBR_`` error code onto a SimpleBroker exception."""
    known = SCRIPT_ERRORS.get(code)
    if known is None:
        return _operational(f"simplebroker-redis script failed ({code}): {detail}", retryable=False)
    return known.build(detail, where)


def _located(text: str) -> str:
    """Point ``user_script:<line>`` of a script error at the Lua file and line."""
    match = _SCRIPT_SHA_RE.search(text)
    if match is None:
        return text
    sha = match.group(1)

    def swap(line: re.Match[str]) -> str:
        return locate(sha, int(line.group(1))) or line.group(0)

    return _USER_SCRIPT_RE.sub(swap, text)


#: What to do when the Functions library is missing and the user may not load it.
LOAD_LIBRARY_HINT: Final[str] = (
    " (the Functions library is not loaded on this server, and this user may not load "
    "it: an administrator loads it once per server with `python -m "
    "simplebroker_redis.scripts load redis://ADMIN:PASSWORD@HOST:PORT/DB`, see the "
    "README's Least-privilege ACL; or set backend option scripting = 'eval' and grant "
    "+evalsha +script|load)"
)


def _permission_hint(text: str) -> str:
    """Return what to do about a denial of the commands that run the scripts ('' for others)."""
    if "'function|load'" in text:
        return LOAD_LIBRARY_HINT
    if "'fcall'" in text or "'function" in text:
        return (
            " (grant +fcall; or set backend option scripting = 'eval' and grant "
            "+evalsha +script|load)"
        )
    if "'evalsha'" in text or "'script|load'" in text:
        return " (with scripting = 'eval', grant +evalsha +script|load)"
    return ""


def _translate_response(exc: rx.ResponseError, where: str) -> BaseException:
    match = _SCRIPT_ERROR_RE.match(str(exc))
    if match:
        return script_error(match.group(1), match.group(2), where)
    text = _located(str(exc))
    if _WRONGTYPE_RE.search(text):
        return WrongType(f"damaged simplebroker-redis data in {where}: {text}")
    if text.startswith(("BUSY", "LOADING", "TRYAGAIN", "MASTERDOWN")):
        return _operational(f"Redis at {where} is busy: {text}", retryable=True)
    if isinstance(exc, (rx.AskError, rx.TryAgainError, rx.ClusterDownError, rx.ReadOnlyError)):
        # MOVED, ASK, TRYAGAIN, CLUSTERDOWN, READONLY: refused before running.
        hint = ""
        if isinstance(exc, rx.AskError) and "+cluster://" not in where:
            hint = " (the server is a Redis Cluster node: use a redis+cluster:// target)"
        return _operational(
            f"the primary of {where} is moving or down (nothing ran; retry later): "
            f"{type(exc).__name__}: {text}{hint}",
            retryable=True,
        )
    if isinstance(exc, rx.NoPermissionError) or text.startswith("NOPERM"):
        return AccessDenied(f"Redis at {where} denied access: {text}{_permission_hint(text)}")
    hint = ""
    if "DB index is out of range" in text:
        hint = (
            " (the URL's database number is beyond the server's 'databases' setting, "
            "16 by default: use 0-15)"
        )
    return Rejected(f"Redis at {where} rejected a command: {text}{hint}")


_TLS_DROPS: Final = (
    ssl.SSLEOFError,
    ssl.SSLZeroReturnError,
    ssl.SSLSyscallError,
    ssl.SSLWantReadError,
    ssl.SSLWantWriteError,
)


def _tls_failed(exc: BaseException) -> str | None:
    """Return how a connection failed in its TLS set-up (verification, files), else None.

    A handshake that timed out or was cut is left out: the next one may work.
    """
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, ssl.SSLError):
            # A connection closed mid-handshake is a drop, not a TLS setting.
            return None if isinstance(cause, _TLS_DROPS) else "the TLS handshake failed"
        if isinstance(cause, OSError) and not isinstance(cause, TimeoutError):
            # redis-py reports an unreadable ssl_ca_certs/ssl_certfile as a bare
            # OSError; its traceback shows it came from the TLS context.
            frames = traceback.extract_tb(cause.__traceback__)
            if any(frame.name in _TLS_SETUP_FRAMES for frame in frames):
                return "a file named by ssl_ca_certs, ssl_certfile or ssl_keyfile cannot be read"
        cause = cause.__cause__ or cause.__context__
    return None


def _unreachable(exc: BaseException, where: str, changing: bool) -> OperationalError:
    """Return the error of a transport failure: nothing sent, or a change's outcome unknown."""
    not_sent = bool(_CONNECT_FAILED_RE.search(str(exc)))
    if changing and not not_sent:
        return OutcomeUnknown(
            f"no reply from Redis at {where} to a change that was sent "
            f"({type(exc).__name__}: {exc}): its outcome is unknown; it may have been "
            "applied (a write's message may have been stored), or may still be when the "
            "network delivers the request late"
        )
    return _operational(
        f"cannot reach Redis at {where}: {type(exc).__name__}: {exc}", retryable=not_sent
    )


def transient(exc: BaseException) -> bool:
    """Return whether a later attempt may succeed: the server was unreachable, busy, or silent.

    True for a retryable ``OperationalError`` and for a transport failure
    (``OutcomeUnknown`` included: repeat only what is safe to repeat);
    never for a refusal no retry can fix (``AccessDenied``).
    """
    if isinstance(exc, AccessDenied | rx.AuthenticationError):
        return False
    if isinstance(exc, OutcomeUnknown):
        return True
    if isinstance(exc, OperationalError):
        if exc.retryable:
            return True
        exc = exc.__cause__ if exc.__cause__ is not None else exc
        if isinstance(exc, rx.AuthenticationError):
            return False
    return isinstance(exc, rx.ConnectionError | rx.TimeoutError | OSError)


def _tls_refusal(exc: BaseException, where: str) -> AccessDenied | None:
    """Return the refusal of a connection that failed in TLS, else None (see ``AccessDenied``).

    A plain-text port behind a ``rediss://`` URL (the connection asked it once,
    :mod:`.tlsprobe`), a failed verification, TLS files that cannot be read.
    """
    if not isinstance(exc, (rx.ConnectionError, rx.TimeoutError, OSError)):
        return None
    mismatch = found_mismatch(exc)
    if mismatch is not None:
        failure = mismatch.failure if exc is mismatch else exc  # what the connect said
        return AccessDenied(
            f"cannot reach Redis at {where}: TLS mismatch: {mismatch.address} answers in plain "
            "text, not TLS; use redis:// for this port, or rediss:// with the server's TLS "
            f"port (its tls-port): {type(failure).__name__}: {failure}"
        )
    tls = _tls_failed(exc)
    if tls is not None:
        return AccessDenied(f"cannot reach Redis at {where}: {tls}: {type(exc).__name__}: {exc}")
    return None


def translate(exc: BaseException, where: str, *, changing: bool = False) -> BaseException:
    """Return the SimpleBroker exception for a redis-py exception.

    ``where`` names the redacted target and namespace for the message.
    ``changing``: the command changes state (a script that writes, a plain
    command marked ``writes``). A transport failure after such a command
    was sent is :class:`OutcomeUnknown`, not "cannot reach": only a
    connection that could not be opened proves nothing was sent.
    """
    if isinstance(exc, (BrokerError, ScriptConflict)):
        return exc
    if isinstance(exc, rx.ResponseError):
        return _translate_response(exc, where)
    if isinstance(exc, rx.AuthenticationError) or str(exc).startswith("NOAUTH"):
        if _AUTH_REQUIRED_RE.search(str(exc)):
            return AccessDenied(
                f"cannot authenticate to Redis at {where}: the server requires a password and "
                "none was given; put it in the URL (redis://[user]:PASSWORD@host:port/db) or "
                "in BROKER_BACKEND_PASSWORD"
            )
        return AccessDenied(
            f"cannot authenticate to Redis at {where}: the server refused the user name or "
            f"password ({exc})"
        )
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
    refused = _tls_refusal(exc, where)
    if refused is not None:
        return refused
    if isinstance(exc, (rx.ConnectionError, rx.TimeoutError, OSError)):
        return _unreachable(exc, where, changing)
    if isinstance(exc, rx.RedisError):
        return _operational(f"Redis error at {where}: {exc}", retryable=False)
    return exc
