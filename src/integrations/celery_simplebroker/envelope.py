"""kombu messages as SimpleBroker message bodies, and the delivery tags of reserved ones.

A kombu message (the virtual transport's payload: body, headers,
properties) is stored as one JSON text. Bodies that are UTF-8 are stored as
text rather than base64 (:func:`encode_body`), so ``broker peek celery``
shows readable tasks. A message's ``expiration`` becomes an absolute expiry
in the envelope (:data:`EXPIRES_FIELD`), checked when it is taken.

A reserved message's delivery tag is ``"<token>:<id>"``, so acknowledging
it needs no lookup; a claimed one (``no_ack``) has ``"claimed:<id>"``.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable, Iterable
from typing import Any, Final

from simplebroker_redis import LeasedMessage

#: Body encoding: UTF-8 bodies stored as text, others as base64.
AUTO_ENCODING: Final[str] = "text-or-base64"

#: Envelope field holding a message's expiry (epoch seconds), from its ``expiration``.
EXPIRES_FIELD: Final[str] = "sb-expires-at"

#: A reserved message: (reservation token, message).
Buffered = tuple[str, LeasedMessage]

#: A reserved message's identity: (reservation token, message ID).
Tag = tuple[str, int]


class Unreadable(ValueError):
    """A stored message is not a kombu envelope (another program wrote it)."""


def encode_body(
    body: Any, encoding: str | None, fallback: Callable[[Any, str | None], tuple[Any, str | None]]
) -> tuple[Any, str | None]:
    """Encode a body for the JSON envelope: text when it is UTF-8, else ``fallback``'s way."""
    if encoding == AUTO_ENCODING or (encoding == "utf-8" and isinstance(body, bytes)):
        if isinstance(body, str):
            return body, "utf-8"
        try:
            return bytes(body).decode("utf-8"), "utf-8"
        except UnicodeDecodeError:
            return base64.b64encode(body).decode("ascii"), "base64"
    return fallback(body, encoding)


def seal(message: dict[str, Any], drop: Iterable[str] = ()) -> str:
    """Return the stored text of a kombu message (its ``expiration`` made absolute).

    ``drop``: fields of its properties and headers that are not stored.
    """
    expiration = message.get("properties", {}).get("expiration")
    if expiration is not None and EXPIRES_FIELD not in message:
        message[EXPIRES_FIELD] = time.time() + float(expiration) / 1000
    dropped = tuple(drop)
    if dropped:
        message = dict(message)
        for name in ("properties", "headers"):
            value = message.get(name)
            if isinstance(value, dict) and any(field in value for field in dropped):
                message[name] = {k: v for k, v in value.items() if k not in dropped}
    return json.dumps(message)


def open_body(body: str, message_id: int, *, tag: str, deliveries: int) -> dict[str, Any]:
    """Return the kombu payload of a stored message, tagged and marked redelivered.

    ``deliveries`` counts this one (0: unknown, a claim). A message delivered
    before (requeued, handed back at a channel's close, or recovered from a
    dead worker) carries ``redelivered`` in its ``delivery_info`` and, as
    kombu's Redis transport marks a restored message, in its ``headers``.

    Raises:
        Unreadable: ``body`` is not a kombu envelope.

    """
    try:
        payload: dict[str, Any] = json.loads(body)
        properties = payload["properties"]
        properties["delivery_tag"] = tag
    except (ValueError, KeyError, TypeError) as exc:
        raise Unreadable(f"message {message_id} is not a kombu message") from exc
    redelivered = deliveries > 1
    properties.setdefault("delivery_info", {})["redelivered"] = redelivered
    payload["redelivered"] = redelivered
    if redelivered:
        headers = payload.get("headers")
        if isinstance(headers, dict):
            headers["redelivered"] = True
        elif headers is None:
            payload["headers"] = {"redelivered": True}
    return payload


def expired(payload: dict[str, Any], message_id: int, ttl: float | None) -> bool:
    """Return True when the message is to be dropped: its own expiry, or its queue's TTL, passed.

    A Celery task's own expiry (``apply_async(expires=...)``, which Celery
    also sends as the message's ``expiration``) is left to the worker: the
    task is delivered, and the worker revokes it and stores its REVOKED
    result ("expired"), so ``get()`` raises ``TaskRevokedError`` instead of
    waiting for a result that never comes. Celery's Redis transport does
    the same (it ignores ``expiration``). Other messages are dropped.
    """
    now = time.time()
    expires_at = payload.get(EXPIRES_FIELD)
    if expires_at is not None and now > float(expires_at) and not is_task(payload):
        return True
    # A message ID is its writer's wall clock in nanoseconds (SimpleBroker's hybrid IDs).
    return ttl is not None and now > message_id / 1e9 + ttl


def is_task(payload: dict[str, Any]) -> bool:
    """Return whether a kombu message is a Celery task (message protocol 2: headers name it)."""
    headers = payload.get("headers")
    return isinstance(headers, dict) and "task" in headers and "id" in headers


def delivery_tag(token: str, message_id: int) -> str:
    """Return the delivery tag of a reserved message."""
    return f"{token}:{message_id}"


def claimed_tag(message_id: int) -> str:
    """Return the delivery tag of a claimed message (nothing to acknowledge)."""
    return f"claimed:{message_id}"


def parse_tag(tag: str) -> Tag:
    """Return (token, message id) of a delivery tag made by :func:`delivery_tag`.

    Raises:
        ValueError: ``tag`` is not one of this transport's tags.

    """
    token, _, message_id = str(tag).rpartition(":")
    return token, int(message_id)


def by_token(tags: Iterable[str]) -> dict[str, list[int]]:
    """Group delivery tags by reservation token."""
    return _grouped(parse_tag(tag) for tag in tags)


def reserved_by_token(reserved: Iterable[Buffered]) -> dict[str, list[int]]:
    """Group reserved (token, message) pairs' IDs by reservation token."""
    return _grouped((token, message.id) for token, message in reserved)


def _grouped(pairs: Iterable[Tag]) -> dict[str, list[int]]:
    groups: dict[str, list[int]] = {}
    for token, message_id in pairs:
        groups.setdefault(token, []).append(message_id)
    return groups
