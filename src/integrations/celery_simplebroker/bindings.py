"""Exchange bindings shared by every process of a namespace.

kombu's virtual transports keep exchanges and bindings in process memory.
Routing through a named exchange must see the bindings other processes made
(a worker's pidbox queue bound to Celery's fanout control exchange, a
client's reply queue bound to the reply exchange), so bindings live in the
namespace: one hash of ``"<exchange> US <routing key> US <queue>"`` -> JSON,
plus one sorted set of deadlines for bindings of queues that expire when
unused (``x-expires`` or ``auto_delete``). Their consumer's heartbeat
restarts the lifetime; once it runs out (the consumer died), the next
lookup removes the binding and the transport deletes the queue's messages,
so broadcasts stop piling up in the mailbox of a dead worker.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

import redis

from simplebroker_redis import RedisRunner

from .keys import BINDING_SEPARATOR, CeleryKeys
from .scripts import run_script


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
    """The namespace's exchange tables (one round trip per operation)."""

    def __init__(self, runner: RedisRunner) -> None:
        self._runner = runner
        self._keys = CeleryKeys.of(runner.keys)

    def bind(self, bindings: Iterable[Binding]) -> None:
        """Record ``bindings`` and (re)start the lifetime of the expiring ones."""
        args: list[object] = []
        for binding in bindings:
            value = json.dumps({"p": binding.pattern})
            args += [binding.name, value, round(binding.lifetime * 1000)]
        if args:
            keys = (self._keys.bindings, self._keys.binding_deadlines)
            run_script(self._runner, "bind", keys, args)

    def table(self, exchange: str) -> tuple[list[Binding], list[Binding]]:
        """Return the live bindings of ``exchange``, and the expired ones just removed."""
        keys = (self._keys.bindings, self._keys.binding_deadlines)
        raw = run_script(self._runner, "exchange_table", keys, [exchange])
        count = int(raw[0])
        live = [_parse(raw[i], raw[i + 1]) for i in range(1, 2 * count + 1, 2)]
        removed = [_parse(name, "{}") for name in raw[2 * count + 1 :]]
        return live, removed

    def unbind_queue(self, queue: str) -> None:
        """Remove every binding of the Celery queue ``queue`` (two round trips)."""
        keys = self._keys
        suffix = BINDING_SEPARATOR + queue

        def remove(client: redis.Redis) -> None:
            names = [
                name
                for name in map(str, client.hkeys(keys.bindings))
                if name.endswith(suffix) and name.split(BINDING_SEPARATOR, 2)[-1] == queue
            ]
            if names:
                pipe = client.pipeline(transaction=True)
                pipe.hdel(keys.bindings, *names)
                pipe.zrem(keys.binding_deadlines, *names)
                pipe.execute()

        self._runner.execute(remove)
