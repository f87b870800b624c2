"""Reservations with renewable leases: the at-least-once API for integrations.

A *lease* reserves up to N pending messages of a queue under a fresh token.
Reserved messages stay pending for ``peek`` and stats, but nobody else can
claim, move or delete them until the holder settles them:

- :meth:`Leases.ack` consumes IDs (claimed, or deleted with ``delete=True``),
- :meth:`Leases.reject` moves IDs to another queue (a dead-letter queue),
- :meth:`Leases.release` makes IDs pending again, optionally after a delay,
- :meth:`Leases.renew` extends the leases of many tokens in one round trip,
- :meth:`Leases.recover` releases reservations whose lease expired.

Every call is one Lua script (one round trip). Each message carries a
delivery count: how many times it has been reserved. With ``max_deliveries``
a message whose lease expires (or is released) after its last allowed
delivery goes to the ``dead_letter`` queue instead of being redelivered.

SimpleBroker's ``at_least_once`` generators are the special case whose lease
is ``stale_batch_seconds`` from creation. :class:`AsyncLeases` in
:mod:`simplebroker_redis.aio` runs the same scripts on an asyncio client.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from .keys import format_id
from .runner import RedisRunner
from .validation import validate_queue_name

SettleMode = Literal["claim", "delete", "move"]


@dataclass(frozen=True, slots=True)
class LeasedMessage:
    """One reserved message."""

    id: int
    body: str
    deliveries: int  #: times this message has been reserved, this one included


@dataclass(frozen=True, slots=True)
class Lease:
    """The result of a reservation; ``messages`` is empty when none was pending."""

    token: str
    queue: str
    messages: tuple[LeasedMessage, ...]
    created_ns: int  #: server time of the reservation, integer nanoseconds
    deadline_ns: int | None  #: lease expiry (server time), None: never expires
    next_due_seconds: float | None  #: when a delayed message becomes due, if any

    @property
    def ids(self) -> tuple[int, ...]:
        """Return the reserved message IDs in delivery order."""
        return tuple(message.id for message in self.messages)


@dataclass(frozen=True, slots=True)
class Settlement:
    """Outcome of ack/reject: IDs settled, and IDs the token no longer held."""

    settled: int
    lost: int


@dataclass(frozen=True, slots=True)
class Recovery:
    """Outcome of a recovery pass."""

    released: int  #: live message IDs made pending again (or dead-lettered)
    tokens: int  #: expired reservations recovered
    more: bool  #: True when more expired reservations may remain


def new_token() -> str:
    """Return a fresh reservation token."""
    return uuid.uuid4().hex


def lease_microseconds(lease_seconds: float | None) -> int:
    """Return a lease as integer microseconds (-1: never expires).

    The lease is first made exact integer nanoseconds; a reservation is stale
    once ``now_ns - created_ns > lease_ns`` on the server clock, which for
    microsecond server clocks is ``now_us > created_us + lease_ns // 1000``.
    """
    if lease_seconds is None:
        return -1
    if isinstance(lease_seconds, bool) or not isinstance(lease_seconds, (int, float)):
        raise TypeError("lease_seconds must be a number or None")
    if not math.isfinite(lease_seconds) or lease_seconds < 0:
        raise ValueError("lease_seconds must be a finite number >= 0")
    return round(lease_seconds * 1_000_000_000) // 1000


def reserve_args(
    queue: str,
    token: str,
    limit: int,
    lease_seconds: float | None,
    *,
    target: str = "",
    after: int | None = None,
    before: int | None = None,
    exact: int | None = None,
    max_deliveries: int | None = None,
    dead_letter: str | None = None,
    order: str = "oldest",
    maintenance: str = "",
) -> list[object]:
    """Validate a reservation request and return the ``reserve`` script ARGV.

    ``maintenance`` is a core's piggybacked maintenance request (internal).
    """
    validate_queue_name(queue)
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError("limit must be an integer >= 1")
    if target:
        validate_queue_name(target)
    if max_deliveries is not None:
        if isinstance(max_deliveries, bool) or not isinstance(max_deliveries, int):
            raise TypeError("max_deliveries must be an integer or None")
        if max_deliveries < 1:
            raise ValueError("max_deliveries must be >= 1")
        if dead_letter is None:
            raise ValueError("max_deliveries requires a dead_letter queue")
    if dead_letter is not None:
        validate_queue_name(dead_letter)
        if dead_letter == queue:
            raise ValueError("dead_letter must differ from the reserved queue")
    return [
        queue,
        token,
        limit,
        lease_microseconds(lease_seconds),
        target,
        "" if after is None else format_id(after),
        "" if before is None else format_id(before),
        "" if exact is None else format_id(exact),
        max_deliveries or 0,
        dead_letter or "",
        order,
        maintenance,
    ]


def parse_reserve(token: str, queue: str, raw: Sequence[Any]) -> Lease:
    """Build a :class:`Lease` from the ``reserve`` script reply."""
    created_us, deadline_us, due_us = int(raw[0]), int(raw[1]), int(raw[2])
    messages = tuple(
        LeasedMessage(int(raw[i]), raw[i + 1], int(raw[i + 2])) for i in range(3, len(raw), 3)
    )
    return Lease(
        token=token,
        queue=queue,
        messages=messages,
        created_ns=created_us * 1000,
        deadline_ns=None if deadline_us < 0 else deadline_us * 1000,
        next_due_seconds=None if due_us < 0 else due_us / 1_000_000,
    )


def id_args(ids: Iterable[int] | None) -> list[str]:
    """Return script ARGV for an ID selection (``'*'`` for all of a token)."""
    if ids is None:
        return ["*"]
    return [format_id(int(message_id)) for message_id in ids]


def settle_args(
    token: str, mode: SettleMode, target: str, ids: Iterable[int] | None
) -> list[object]:
    """Validate and build the ``settle`` script ARGV."""
    if mode not in ("claim", "delete", "move"):
        raise ValueError("mode must be 'claim', 'delete' or 'move'")
    if target:
        validate_queue_name(target)
    return [token, mode, target, *id_args(ids)]


def release_args(
    token: str, ids: Iterable[int] | None, delay_seconds: float, undeliver: bool
) -> list[object]:
    """Validate and build the ``release`` script ARGV."""
    if isinstance(delay_seconds, bool) or not isinstance(delay_seconds, (int, float)):
        raise TypeError("delay_seconds must be a number")
    if not math.isfinite(delay_seconds) or delay_seconds < 0:
        raise ValueError("delay_seconds must be a finite number >= 0")
    return [token, round(delay_seconds * 1_000_000), "1" if undeliver else "0", *id_args(ids)]


def renew_args(tokens: Iterable[str], lease_seconds: float | None) -> list[object]:
    """Build the ``renew`` script ARGV (``None``: each token's own lease)."""
    lease = "" if lease_seconds is None else lease_microseconds(lease_seconds)
    return [lease, *tokens]


def recover_args(queue: str | None, max_tokens: int) -> list[object]:
    """Validate and build the ``recover`` script ARGV."""
    if queue is not None:
        validate_queue_name(queue)
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError("max_tokens must be an integer >= 1")
    return [queue or "", max_tokens]


def parse_recovery(raw: Sequence[Any]) -> Recovery:
    """Build a :class:`Recovery` from the ``recover`` script reply."""
    return Recovery(released=int(raw[0]), tokens=int(raw[1]), more=bool(int(raw[2])))


class Leases:
    """Synchronous reservation API over a :class:`RedisRunner`."""

    def __init__(self, runner: RedisRunner) -> None:
        self.runner = runner
        runner.ensure_initialized()

    def reserve(
        self,
        queue: str,
        limit: int,
        lease_seconds: float | None,
        *,
        max_deliveries: int | None = None,
        dead_letter: str | None = None,
        target: str = "",
        after: int | None = None,
        before: int | None = None,
        exact: int | None = None,
        order: str = "oldest",
        maintenance: str = "",
    ) -> Lease:
        """Reserve up to ``limit`` pending messages of ``queue`` for ``lease_seconds``."""
        token = new_token()
        args = reserve_args(
            queue,
            token,
            limit,
            lease_seconds,
            target=target,
            after=after,
            before=before,
            exact=exact,
            max_deliveries=max_deliveries,
            dead_letter=dead_letter,
            order=order,
            maintenance=maintenance,
        )
        return parse_reserve(token, queue, self.runner.call("reserve", args))

    def ack(
        self, token: str, ids: Iterable[int] | None = None, *, delete: bool = False
    ) -> Settlement:
        """Consume ``ids`` of a token (all when None): claimed, or deleted."""
        raw = self.runner.call(
            "settle", settle_args(token, "delete" if delete else "claim", "", ids)
        )
        return Settlement(int(raw[0]), int(raw[1]))

    def reject(self, token: str, ids: Iterable[int] | None, queue: str) -> Settlement:
        """Move ``ids`` of a token (all when None) to ``queue``, pending, same IDs."""
        validate_queue_name(queue)
        raw = self.runner.call("settle", settle_args(token, "move", queue, ids))
        return Settlement(int(raw[0]), int(raw[1]))

    def commit(self, token: str, mode: SettleMode = "claim") -> Settlement:
        """Settle every ID of a token with ``mode`` ('move' uses its reserve target)."""
        raw = self.runner.call("settle", settle_args(token, mode, "", None))
        return Settlement(int(raw[0]), int(raw[1]))

    def release(
        self,
        token: str,
        ids: Iterable[int] | None = None,
        *,
        delay_seconds: float = 0.0,
        undeliver: bool = False,
    ) -> int:
        """Make ``ids`` of a token (all when None) pending again; return how many."""
        return int(self.runner.call("release", release_args(token, ids, delay_seconds, undeliver)))

    def renew(self, tokens: Iterable[str], lease_seconds: float | None = None) -> set[str]:
        """Extend leases of ``tokens``; return the tokens that no longer exist."""
        token_list = list(tokens)
        if not token_list:
            return set()
        return set(self.runner.call("renew", renew_args(token_list, lease_seconds)))

    def recover(self, queue: str | None = None, *, max_tokens: int = 256) -> Recovery:
        """Release expired reservations (of ``queue`` or every queue)."""
        return parse_recovery(self.runner.call("recover", recover_args(queue, max_tokens)))

    def deliveries(self, message_id: int) -> int:
        """Return how many times ``message_id`` has been reserved."""
        key = self.runner.keys.deliveries
        value = self.runner.execute(
            lambda client: client.hget(key, format_id(int(message_id))), idempotent=True
        )
        return int(value or 0)
