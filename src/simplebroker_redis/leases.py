"""Reservations with renewable leases: the at-least-once API for integrations.

A *lease* reserves up to N pending messages of a queue under a fresh token.
Reserved messages stay pending for ``peek`` and stats, but nobody else can
claim, move or delete them until the holder settles them:

- ``ack`` consumes IDs (claimed, or deleted with ``delete=True``),
- ``reject`` moves IDs to another queue (a dead-letter queue),
- ``release`` makes IDs pending again, optionally after a delay,
- ``renew`` extends the leases of many tokens in one round trip,
- ``recover`` releases reservations whose lease expired.

``reserve_queues`` reserves from several queues in one round trip, in strict
order, with one token per queue that gave messages.

A message dead-lettered after ``max_deliveries`` is also recorded in the
namespace's dead-letter journal (a capped stream): ``dead_letters`` reads
its entries after a cursor, ``dead_letter_ack`` takes one out (optionally
storing a value, such as an error result, where none is), and exactly one
of any number of consumers acknowledging one entry is told it did, so it
alone reports it.

Every call is one Lua script (one round trip). Each message carries a
delivery count: how many times it has been reserved. With ``max_deliveries``
a message whose lease expires (or is released) after its last allowed
delivery goes to the ``dead_letter`` queue instead of being redelivered.

:class:`LeaseCalls` defines each operation once, as a typed
:class:`~simplebroker_redis.calls.Call`. :class:`Leases` runs them on a
:class:`~simplebroker_redis.RedisRunner`; its asyncio twin,
:class:`~simplebroker_redis.aio.AsyncLeases`, returns the same calls bound
to an asyncio runner, ready to ``await``. SimpleBroker's ``at_least_once``
generators are the special case whose lease is ``stale_batch_seconds``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Concatenate, ParamSpec, TypeVar

from . import calls
from .calls import Call
from .keys import Keyspace, format_id
from .runner import RedisRunner
from .types import Settlement, SettleMode
from .validation import validate_queue_name

P = ParamSpec("P")
R = TypeVar("R")

__all__ = ["LeaseCalls", "Leases"]


def _count(raw: Any) -> int:
    return int(raw or 0)


def _bound(
    build: Callable[P, Call[R]],
) -> Callable[Concatenate[LeaseCalls, P], Call[R]]:
    """Turn a :mod:`.calls` builder into a :class:`LeaseCalls` method (its call bound)."""

    def method(lease_calls: LeaseCalls, /, *args: P.args, **kwargs: P.kwargs) -> Call[R]:
        return lease_calls.bind(build(*args, **kwargs))

    method.__name__ = method.__qualname__ = build.__name__
    method.__doc__ = build.__doc__
    return method


class LeaseCalls:
    """The reservation operations of one namespace, each a typed call.

    ``bind`` is applied to every call built here: the identity for
    :class:`Leases` (which runs them), a binding to an asyncio runner for
    :class:`~simplebroker_redis.aio.AsyncLeases` (whose callers await them).
    """

    def __init__(self, keys: Keyspace) -> None:
        self.keys = keys

    def bind(self, call: Call[R]) -> Call[R]:
        """Return ``call`` ready for this API's callers (unchanged here)."""
        return call

    def ack(
        self, token: str, ids: Iterable[int] | None = None, *, delete: bool = False
    ) -> Call[Settlement]:
        """Consume ``ids`` of a token (all when None): claimed, or deleted."""
        return self.bind(calls.settle(token, "delete" if delete else "claim", "", ids))

    def reject(self, token: str, ids: Iterable[int] | None, queue: str) -> Call[Settlement]:
        """Move ``ids`` of a token (all when None) to ``queue``, pending, same IDs."""
        validate_queue_name(queue)
        return self.bind(calls.settle(token, "move", queue, ids))

    def commit(self, token: str, mode: SettleMode = "claim") -> Call[Settlement]:
        """Settle every ID of a token with ``mode`` ('move' uses its reserve target)."""
        return self.bind(calls.settle(token, mode))

    reserve = _bound(calls.reserve)
    reserve_queues = _bound(calls.reserve_queues)
    release = _bound(calls.release)
    renew = _bound(calls.renew)
    recover = _bound(calls.recover)
    dead_letters = _bound(calls.dead_letters)
    dead_letter_ack = _bound(calls.dead_letter_ack)

    def deliveries(self, message_id: int) -> Call[int]:
        """Return how many times ``message_id`` has been reserved."""
        key, field = self.keys.deliveries, format_id(int(message_id))
        read = Call(_count, command=lambda client: client.hget(key, field), idempotent=True)
        return self.bind(read)


def _ran(
    build: Callable[Concatenate[LeaseCalls, P], Call[R]],
) -> Callable[Concatenate[Leases, P], R]:
    """Turn a :class:`LeaseCalls` builder into a :class:`Leases` method that runs it."""

    def method(leases: Leases, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return leases.runner.run(build(leases.calls, *args, **kwargs))

    method.__name__ = method.__qualname__ = build.__name__
    method.__doc__ = build.__doc__
    return method


class Leases:
    """Synchronous reservation API over a :class:`RedisRunner` (see :class:`LeaseCalls`)."""

    def __init__(self, runner: RedisRunner) -> None:
        self.runner = runner
        self.calls = LeaseCalls(runner.keys)
        runner.ensure_initialized()

    reserve = _ran(LeaseCalls.reserve)
    reserve_queues = _ran(LeaseCalls.reserve_queues)
    ack = _ran(LeaseCalls.ack)
    reject = _ran(LeaseCalls.reject)
    commit = _ran(LeaseCalls.commit)
    release = _ran(LeaseCalls.release)
    renew = _ran(LeaseCalls.renew)
    recover = _ran(LeaseCalls.recover)
    dead_letters = _ran(LeaseCalls.dead_letters)
    dead_letter_ack = _ran(LeaseCalls.dead_letter_ack)
    deliveries = _ran(LeaseCalls.deliveries)
