"""Exchange bindings shared by every process of a namespace.

kombu's virtual transports keep exchanges and bindings in process memory.
Routing through a named exchange must see the bindings other processes made
(a worker's pidbox queue bound to Celery's fanout control exchange, a
client's reply queue bound to the reply exchange), so bindings live in the
namespace: one hash of ``"<exchange> US <routing key> US <queue>"`` -> JSON,
plus one sorted set of deadlines for bindings of queues that expire when
unused (``x-expires`` or ``auto_delete``). Their consumer's heartbeat
restarts the lifetime; once it runs out (the consumer died), the next
lookup removes the binding and the channel deletes the queue's messages,
so broadcasts stop piling up in the mailbox of a dead worker.

:class:`Declarations` keeps what this process declared: queues' message
TTLs and lifetimes, and the expiring bindings its heartbeat refreshes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from simplebroker_redis import RedisRunner, ReplicationTimeout, calls
from simplebroker_redis.calls.celery import BindingRecord

#: Separates exchange, routing key and queue in a binding's name.
BINDING_SEPARATOR: Final[str] = "\x1f"

#: Lifetime (seconds) of the bindings of an ``auto_delete`` queue without ``x-expires``.
AUTO_DELETE_LIFETIME: Final[float] = 30.0


@dataclass(frozen=True, slots=True)
class Binding:
    """One queue bound to an exchange."""

    exchange: str
    routing_key: str
    queue: str  #: the Celery queue name
    pattern: str | None = None  #: regular expression of a topic binding
    lifetime: float = 0.0  #: seconds the binding lives unrefreshed (0: forever)

    @property
    def name(self) -> str:
        """Return the binding's field name in the bindings hash."""
        return BINDING_SEPARATOR.join((self.exchange, self.routing_key, self.queue))


def _parse(name: str, value: str) -> Binding:
    exchange, routing_key, queue = name.split(BINDING_SEPARATOR, 2)
    pattern = json.loads(value).get("p")
    return Binding(exchange, routing_key, queue, pattern)


class Bindings:
    """The namespace's exchange tables (one script, one round trip, per operation)."""

    def __init__(self, runner: RedisRunner) -> None:
        self._runner = runner

    def bind(self, bindings: Iterable[Binding]) -> None:
        """Record ``bindings`` and (re)start the lifetime of the expiring ones."""
        records = [
            BindingRecord(b.name, json.dumps({"p": b.pattern}), round(b.lifetime * 1000))
            for b in bindings
        ]
        if records:
            self._runner.run(calls.celery_bind(self._runner.keys, records))

    def table(self, exchange: str) -> tuple[list[Binding], list[Binding]]:
        """Return the live bindings of ``exchange``, and the expired ones just removed.

        A lookup whose removals too few replicas confirmed (``ReplicationTimeout``,
        with ``wait_replicas``) still answers: a removal a failover loses is
        made again by the next lookup.
        """
        try:
            table = self._runner.run(calls.celery_exchange_table(self._runner.keys, exchange))
        except ReplicationTimeout as exc:
            table = exc.result
        live = [_parse(name, value) for name, value in table.live]
        removed = [_parse(name, "{}") for name in table.removed]
        return live, removed

    def unbind_queue(self, queue: str) -> int:
        """Remove every binding of the Celery queue ``queue``; return how many."""
        return self._runner.run(calls.celery_unbind(self._runner.keys, queue))


class Declarations:
    """What this process declared: queues' message TTLs and lifetimes, expiring bindings.

    The bindings of queues that expire when unused are refreshed while this
    process consumes them (:meth:`refresh`, at the heartbeat's pace).
    """

    def __init__(self, runner: RedisRunner) -> None:
        self.bindings = Bindings(runner)
        self._ttls: dict[str, float] = {}
        self._lifetimes: dict[str, float] = {}
        self._expiring: dict[str, Binding] = {}

    def declare_queue(self, queue: str, declaration: Mapping[str, Any]) -> None:
        """Record a declared queue's message TTL (``x-message-ttl``) and unused lifetime."""
        arguments = declaration.get("arguments") or {}
        ttl = arguments.get("x-message-ttl")
        if ttl:
            self._ttls[queue] = float(ttl) / 1000
        expires = arguments.get("x-expires")
        if expires:
            self._lifetimes[queue] = float(expires) / 1000
        elif declaration.get("auto_delete"):
            self._lifetimes[queue] = AUTO_DELETE_LIFETIME

    def ttl(self, queue: str) -> float | None:
        """Return the seconds a message of ``queue`` lives (None: no TTL)."""
        return self._ttls.get(queue)

    def bind(self, exchange: str, routing_key: str, pattern: str | None, queue: str) -> None:
        """Record a binding; an expiring one is refreshed while this process consumes it."""
        binding = Binding(exchange, routing_key, queue, pattern, self._lifetimes.get(queue, 0.0))
        self.bindings.bind([binding])
        if binding.lifetime:
            self._expiring[binding.name] = binding

    def refresh(self, consumed: set[str]) -> None:
        """Restart the lifetime of the expiring bindings of the ``consumed`` queues."""
        alive = [b for b in list(self._expiring.values()) if b.queue in consumed]
        if alive:
            self.bindings.bind(alive)
