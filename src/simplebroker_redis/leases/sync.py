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

:class:`Reservations` defines each operation once, as a typed
:class:`~simplebroker_redis.calls.Call`. :class:`Leases` runs them on a
:class:`~simplebroker_redis.RedisRunner`; :class:`LeaseCalls` returns the
calls themselves, and its asyncio subclass,
:class:`~simplebroker_redis.AsyncLeases`, returns them bound to an
asyncio runner, ready to ``await``. SimpleBroker's ``at_least_once``
generators are the special case whose lease is ``stale_batch_seconds``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, overload

from .. import calls
from ..calls import Call
from ..keys import Keyspace, format_id
from ..runner import RedisRunner
from ..types import Settlement, SettleMode
from ..validation import validate_queue_name

P = ParamSpec("P")
R = TypeVar("R")

__all__ = ["LeaseCalls", "Leases", "Reservations"]


class _Operation(Generic[P, R]):
    """One reservation operation: its call, run by :class:`Leases`, returned by :class:`LeaseCalls`.

    ``build`` makes the call from the namespace's keys and the operation's
    arguments; reading the operation from an API object gives a function
    of those arguments that hands the call to the object's ``finish``.
    """

    def __init__(self, build: Callable[Concatenate[Keyspace, P], Call[R]]) -> None:
        self._build = build
        self.__doc__ = build.__doc__

    @classmethod
    def of(cls, build: Callable[P, Call[R]]) -> _Operation[P, R]:
        """Return the operation of a builder that needs no keys (those of :mod:`.calls`)."""

        def keyed(keys: Keyspace, /, *args: P.args, **kwargs: P.kwargs) -> Call[R]:
            return build(*args, **kwargs)

        keyed.__doc__ = build.__doc__
        return cls(keyed)

    @overload
    def __get__(self, api: None, owner: type[Any]) -> _Operation[P, R]: ...
    @overload
    def __get__(self, api: Leases, owner: type[Any]) -> Callable[P, R]: ...
    @overload
    def __get__(self, api: LeaseCalls, owner: type[Any]) -> Callable[P, Call[R]]: ...
    def __get__(self, api: Reservations | None, owner: type[Any]) -> Any:
        if api is None:
            return self
        build, keys, finish = self._build, api.keys, api.finish

        def operation(*args: P.args, **kwargs: P.kwargs) -> Any:
            return finish(build(keys, *args, **kwargs))

        operation.__doc__ = self.__doc__
        return operation


def _ack(token: str, ids: Iterable[int] | None = None, *, delete: bool = False) -> Call[Settlement]:
    """Consume ``ids`` of a token (all when None): claimed, or deleted."""
    return calls.settle(token, "delete" if delete else "claim", "", ids)


def _reject(token: str, ids: Iterable[int] | None, queue: str) -> Call[Settlement]:
    """Move ``ids`` of a token (all when None) to ``queue``, pending, same IDs."""
    validate_queue_name(queue)
    return calls.settle(token, "move", queue, ids)


def _commit(token: str, mode: SettleMode = "claim") -> Call[Settlement]:
    """Settle every ID of a token with ``mode`` ('move' uses its reserve target)."""
    return calls.settle(token, mode)


def _count(raw: Any) -> int:
    return int(raw or 0)


def _deliveries(keys: Keyspace, message_id: int) -> Call[int]:
    """Return how many times ``message_id`` has been reserved."""
    key, field = keys.deliveries, format_id(int(message_id))
    return Call(_count, command=lambda client: client.hget(key, field), idempotent=True)


class Reservations:
    """The reservation operations of one namespace, each written once.

    Every operation builds one typed call and hands it to :meth:`finish`:
    :class:`Leases` runs it, :class:`LeaseCalls` returns it.
    """

    keys: Keyspace

    def finish(self, call: Call[Any]) -> Any:
        """Return what an operation gives for ``call`` (see the subclasses)."""
        raise NotImplementedError

    reserve = _Operation.of(calls.reserve)
    reserve_queues = _Operation.of(calls.reserve_queues)
    ack = _Operation.of(_ack)
    reject = _Operation.of(_reject)
    commit = _Operation.of(_commit)
    release = _Operation.of(calls.release)
    renew = _Operation.of(calls.renew)
    renewal = _Operation.of(calls.renewal)
    recover = _Operation.of(calls.recover)
    dead_letters = _Operation.of(calls.dead_letters)
    dead_letter_ack = _Operation.of(calls.dead_letter_ack)
    deliveries = _Operation(_deliveries)


class LeaseCalls(Reservations):
    """The reservation operations of one namespace, each returning its typed call.

    ``bind`` is applied to every call: the identity here, a binding to an
    asyncio runner for :class:`~simplebroker_redis.AsyncLeases` (whose
    callers await the calls).
    """

    def __init__(self, keys: Keyspace) -> None:
        self.keys = keys

    def bind(self, call: Call[R]) -> Call[R]:
        """Return ``call`` ready for this API's callers (unchanged here)."""
        return call

    def finish(self, call: Call[Any]) -> Any:
        """Return ``call``, bound (see :meth:`bind`)."""
        return self.bind(call)


class Leases(Reservations):
    """Synchronous reservation API over a :class:`RedisRunner` (see :class:`Reservations`)."""

    def __init__(self, runner: RedisRunner) -> None:
        self.runner = runner
        self.keys = runner.keys
        runner.ensure_initialized()

    def finish(self, call: Call[Any]) -> Any:
        """Run ``call`` (one round trip) and return its reply."""
        return self.runner.run(call)
