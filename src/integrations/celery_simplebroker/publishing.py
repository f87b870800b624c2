"""Publishes that are idempotent: a retry of a publish never stores a second copy.

kombu retries a publish that raised one of the transport's connection
errors (Celery's ``task_publish_retry``, on by default: 3 retries), and so
does Celery for the callbacks a worker sends. A write whose reply never
came may have reached the server; sent again, it was stored twice, and
``delay()`` returned success after storing its task twice (issue 42).

So every publish carries an *idempotency key* (``write.lua``'s: a write
with a key already used in the last ``dedupe_seconds``, 600 s, stores
nothing and returns the first write's ID). The key is made once per
publish and kept in the message's ``properties`` and ``headers`` dicts,
which kombu and Celery hand to every retry of the same publish
(:data:`PUBLISH_FIELD`); it is combined with the queue and a digest of the
body, so a different message never shares one, and it is taken out of the
dicts once the publish succeeded (and never stored with the message).

A write whose outcome is unknown (its reply timed out, or the connection
broke after the send) raises :class:`PublishOutcomeUnknown`: still a
connection error, so kombu retries it, safely now; after the last retry
the caller learns that the task may have been stored, exactly once. A
later try that could not even connect says so too, not "cannot reach
Redis" alone, because an earlier try of the same publish may have landed.

A publish is bounded in time (the transport option ``publish_timeout``,
5 s by default): each try waits at most that long to connect and for its
reply (the store's publisher has a connection pool of its own with that
timeout), and once that long has passed since the first try, kombu's
retries start no new one: they fail at once, with
:class:`PublishOutcomeUnknown` when an earlier try was sent, else with
the "cannot reach" error. So during a blackhole ``delay()`` fails after
about ``publish_timeout`` (at worst twice that, when a try that failed at
once is followed by one that waits), instead of waiting for the network
to come back (issue 42: it blocked until the heal).
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any, Final

from simplebroker_redis import OutcomeUnknown

from .errors import ServerUnreachable, unreachable

#: Carries a publish's key across its retries (in properties and headers; never stored).
PUBLISH_FIELD: Final[str] = "x-simplebroker-publish"

#: Set in the same dicts once a try of the publish had an unknown outcome.
UNKNOWN_FIELD: Final[str] = "x-simplebroker-unknown"

#: Set in the same dicts by the first try: when it began (``time.monotonic()``).
SINCE_FIELD: Final[str] = "x-simplebroker-since"

#: Seconds after its first try a publish's state can refuse a queue declaration.
STALE_AFTER: Final[float] = 30.0

#: What a stored message never carries.
TRANSIENT_FIELDS: Final[tuple[str, ...]] = (PUBLISH_FIELD, UNKNOWN_FIELD, SINCE_FIELD)


class PublishOutcomeUnknown(OutcomeUnknown):
    """A publish may or may not have stored its message (its reply never came).

    A connection error of the transport, so kombu retries the publish; a
    retry stores the message only if no earlier try did (the publish is
    idempotent), so the task is stored at most once whatever happened.
    """


def _carriers(message: dict[str, Any]) -> list[dict[str, Any]]:
    """Return the message's dicts that a retry of the same publish receives again."""
    found = []
    for name in ("properties", "headers"):
        value = message.get(name)
        if isinstance(value, dict) and value:  # kombu replaces an empty dict on each try
            found.append(value)
    return found


class _Current(threading.local):
    """The publish this thread is trying: whether an earlier try's outcome was unknown.

    And when its first try began (None: no publish under way).
    """

    unknown = False
    since: float | None = None
    failed = False  #: a try or declaration of it could not reach the server


_current = _Current()


def begin(message: dict[str, Any]) -> None:
    """Give a try of a publish its key: the one an earlier try of it gave, or a new one.

    Called when kombu prepares the message, before it declares the queue.
    """
    carriers = _carriers(message)
    key = next((c[PUBLISH_FIELD] for c in carriers if PUBLISH_FIELD in c), None)
    key = key or uuid.uuid4().hex
    unknown = any(c.get(UNKNOWN_FIELD) for c in carriers)
    since = next((c[SINCE_FIELD] for c in carriers if SINCE_FIELD in c), time.monotonic())
    for carrier in carriers:
        carrier[PUBLISH_FIELD] = key
        carrier[SINCE_FIELD] = since
        if unknown:
            carrier[UNKNOWN_FIELD] = True
    _current.unknown = unknown
    if _current.since != since:
        _current.failed = False
    _current.since = since


def done(message: dict[str, Any]) -> None:
    """Forget the publish's key: it succeeded (a later publish of the same dicts is new)."""
    for carrier in _carriers(message):
        for field in TRANSIENT_FIELDS:
            carrier.pop(field, None)
    _current.unknown = False
    _current.since = None
    _current.failed = False


def dedupe_key(message: dict[str, Any], queue: str) -> str | None:
    """Return the write's idempotency key for ``queue`` (storage name); None without one."""
    key = next((c[PUBLISH_FIELD] for c in _carriers(message) if PUBLISH_FIELD in c), None)
    if key is None:
        return None
    body = message.get("body")
    raw = body.encode("utf-8") if isinstance(body, str) else repr(body).encode("utf-8")
    digest = hashlib.sha256(queue.encode("utf-8") + b"\0" + raw).hexdigest()[:24]
    return f"celery.{key}.{digest}"


def check_deadline(message: dict[str, Any], timeout: float, where: str) -> None:
    """Start no new try of a publish ``timeout`` seconds after its first one began.

    Raises (as :func:`check_declaring`):
        PublishOutcomeUnknown: Time is up and an earlier try was sent
            (its message may have been stored, once).
        ServerUnreachable: Time is up and no earlier try reached the server.

    """
    since = next((c[SINCE_FIELD] for c in _carriers(message) if SINCE_FIELD in c), None)
    if isinstance(since, float):
        _timed_out(since, timeout, where, any(c.get(UNKNOWN_FIELD) for c in _carriers(message)))


def check_declaring(timeout: float, where: str) -> None:
    """Start no new try of the queue declaration of a publish whose time is up.

    kombu declares a publish's queue with retries of its own, after the
    publish's try began (:func:`check_deadline` ran); a declaration is
    refused once a try or declaration of the publish failed to reach the
    server and ``timeout`` has passed. A publish that failed for good
    leaves that behind in this thread: after :data:`STALE_AFTER` seconds it
    no longer counts (a consumer's declaration later in the thread is not
    one of a publish).
    """
    since = _current.since
    if since is None or not _current.failed or time.monotonic() - since > STALE_AFTER:
        return
    _timed_out(since, timeout, where, False)


def _timed_out(since: float, timeout: float, where: str, unknown: bool) -> None:
    """Raise the error of a publish whose ``timeout`` passed since ``since`` (if it did)."""
    spent = time.monotonic() - since
    if spent < timeout:
        return
    if _current.unknown or unknown:
        raise PublishOutcomeUnknown(
            f"the outcome of this publish to {where} is unknown: an earlier try got no reply "
            f"and no new try starts {spent:.1f} s after the first (publish_timeout = "
            f"{timeout:g} s); its message may have been stored (at most once: the publish "
            "is idempotent)"
        )
    raise ServerUnreachable(
        f"cannot reach Redis at {where}: no try of this publish reached the server in "
        f"{spent:.1f} s (publish_timeout = {timeout:g} s); nothing was stored"
    )


@contextlib.contextmanager
def attempt(message: dict[str, Any]) -> Iterator[None]:
    """Report a try whose outcome is unknown as :class:`PublishOutcomeUnknown`."""
    try:
        yield
    except OutcomeUnknown as exc:
        for carrier in _carriers(message):
            carrier[UNKNOWN_FIELD] = True
        _current.unknown = _current.failed = True
        raise PublishOutcomeUnknown(
            f"{exc}. The message may have been stored: the publish is idempotent, so "
            "its retries (kombu's, Celery's) store it at most once"
        ) from exc
    except Exception as exc:
        _reraise_if_unknown(exc)
        raise


@contextlib.contextmanager
def preparing() -> Iterator[None]:
    """Around what a retried publish does before it writes (kombu declares the queue)."""
    try:
        yield
    except Exception as exc:
        _reraise_if_unknown(exc)
        raise


def _reraise_if_unknown(exc: Exception) -> None:
    """Raise :class:`PublishOutcomeUnknown` for a connection failure after an unknown try.

    Any connection failure marks the publish as failed (:func:`check_declaring`).

    After a try whose outcome is unknown, the publish's later tries may
    fail before they write (kombu reconnects and declares the queue
    first): their error must not read as if nothing had been stored.
    """
    if unreachable(exc):
        _current.failed = True
    if _current.unknown and unreachable(exc) and not isinstance(exc, OutcomeUnknown):
        raise PublishOutcomeUnknown(
            "the outcome of this publish is unknown: an earlier try got no reply, so its "
            "message may have been stored (at most once: the publish is idempotent); the "
            f"last try failed: {exc}"
        ) from exc
