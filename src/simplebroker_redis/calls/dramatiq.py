"""The Dramatiq integration's room: its keys, its two scripts' calls, and their replies.

Dramatiq's storage needs two operations the core has no script for:

- ``dramatiq_store.lua``: a result stored and its waiters woken (Pub/Sub on
  the pseudo queue :func:`result_queue`), optionally with the
  acknowledgement (delete) of the reserved message whose result it is,
  fenced: a worker that lost its lease stores nothing;
- ``dramatiq_dead.lua``: a nack (the reserved message moved to its
  dead-letter queue, its death time recorded) and the expiry of dead
  messages older than Dramatiq's ``dead_message_ttl``.

Everything else (writes, delays, reservations, renewals, recovery) is the
core's. The keys live under ``sb:{<namespace>}:dramatiq:`` (``Keyspace.dramatiq``)
and reach the scripts as extra ``KEYS``; the replies' types are here, with
their calls, so a Dramatiq change stays in this room.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from ..keys import Keyspace, format_id
from ..validation import validate_queue_name
from .base import Call

#: Prefix of the pseudo queue whose wake channel announces a stored result.
RESULT_QUEUE_PREFIX: Final[str] = "dramatiq-result."


def result_key(keys: Keyspace, message_key: str) -> str:
    """Return the key of the result whose Dramatiq key is ``message_key``."""
    return keys.dramatiq(f"result:{message_key}")


def result_of_key(keys: Keyspace, task_id: str) -> str:
    """Return the key naming the result of Dramatiq message ``task_id`` (its message key).

    Dramatiq's message key is an MD5 of the result namespace, queue, actor
    and message ID: the dashboard, given only the message ID, reads this
    key first (``dramatiq_store.lua`` writes it beside the result).
    """
    return keys.dramatiq(f"result-of:{task_id}")


def dead_times_key(keys: Keyspace) -> str:
    """Return the zset of dead messages (``"<dead-letter queue> <id>"``) -> death (server ms)."""
    return keys.dramatiq("dead")


def result_queue(message_key: str) -> str:
    """Return the pseudo queue whose wake channel announces the result ``message_key``."""
    return validate_queue_name(RESULT_QUEUE_PREFIX + message_key)


@dataclass(frozen=True, slots=True)
class Stored:
    """What ``dramatiq_store.lua`` did."""

    stored: bool  #: False: fenced (the token no longer held the message)
    settled: int  #: messages acknowledged (0 or 1)
    lost: int  #: requested messages the token no longer held


@dataclass(frozen=True, slots=True)
class DeadLettered:
    """What ``dramatiq_dead.lua`` did."""

    settled: int  #: messages moved to the dead-letter queue (0 or 1)
    lost: int  #: requested messages the token no longer held
    expired: int  #: dead messages deleted after their time to live


def _whole(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0")
    return value


def _stored(raw: Any) -> Stored:
    return Stored(bool(int(raw[0])), int(raw[1]), int(raw[2]))


def dramatiq_store(
    keys: Keyspace,
    message_key: str,
    value: str,
    expiry_ms: int,
    *,
    token: str = "",
    message_id: int | None = None,
    task_id: str = "",
) -> Call[Stored]:
    """Store a result (``expiry_ms`` 0: kept) and wake its waiters; with ``token``, ack too.

    ``dramatiq_store.lua``: the acknowledgement deletes ``message_id`` of
    the reservation ``token``; a token that no longer holds it stores
    nothing (``Stored.stored`` False). With ``task_id`` (the Dramatiq
    message ID) it also records, with the same expiry, that this result is
    that message's (:func:`result_of_key`).
    """
    _whole("expiry_ms", expiry_ms)
    if token and message_id is None:
        raise ValueError("an acknowledgement needs the message ID")
    if not message_key:
        raise ValueError("a result needs its message key")
    ack = (token, format_id(int(message_id))) if token and message_id is not None else ("", "")
    args: tuple[object, ...] = (value, expiry_ms, result_queue(message_key), *ack)
    extra: tuple[str, ...] = (result_key(keys, message_key),)
    if task_id:
        args, extra = (*args, message_key), (*extra, result_of_key(keys, task_id))
    return Call(_stored, "dramatiq_store", args, extra_keys=extra)


def _dead(raw: Any) -> DeadLettered:
    return DeadLettered(int(raw[0]), int(raw[1]), int(raw[2]))


def dramatiq_dead(
    keys: Keyspace,
    ttl_ms: int,
    *,
    token: str = "",
    message_id: int | None = None,
    dead_letter: str = "",
    expire: int = 100,
) -> Call[DeadLettered]:
    """Move ``message_id`` of ``token`` to ``dead_letter``; expire up to ``expire`` dead ones.

    ``dramatiq_dead.lua``; without ``token`` it only expires dead messages
    older than ``ttl_ms``.
    """
    _whole("ttl_ms", ttl_ms)
    _whole("expire", expire)
    if token:
        if message_id is None:
            raise ValueError("a dead-lettering needs the message ID")
        validate_queue_name(dead_letter)
        args: tuple[object, ...] = (token, format_id(int(message_id)), dead_letter, ttl_ms, expire)
    else:
        args = ("", "", "", ttl_ms, expire)
    return Call(_dead, "dramatiq_dead", args, extra_keys=(dead_times_key(keys),))
