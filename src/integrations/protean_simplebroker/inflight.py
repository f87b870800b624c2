"""What one broker instance holds: delivered messages, and nacked ones to redeliver.

A nack does not hand the message back to the group: like a Redis Streams
consumer's pending entry, it stays reserved by this consumer (renewed on
Redis, in its held queue on SQLite) and the consumer's next read of that
group returns it first. Protean's subscriptions count their retries per
consumer, so a retried message must come back to the consumer that
counts. Only a consumer that dies (or closes) gives its messages back.

A consumer whose group a Protean subscription owns gets its messages one
per read (a subscription starts each one as soon as it gets it): the rest
of a reservation *waits* here, held and renewed, until a read takes it, so
each message is checked against its lease right before it starts.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass
from typing import Any

from .store import Held

Key = tuple[str, str]  #: (stream, group)


@dataclass
class Taken:
    """One message this consumer holds."""

    held: Held
    payload: dict[str, Any]
    redeliver: bool = False  #: nacked: the next read of its group returns it
    started: float = dataclasses.field(default_factory=time.perf_counter)  #: this delivery's
    waiting: bool = False  #: reserved, not yet returned by a read


class InFlight:
    """Thread-safe map of (stream, group) -> identifier -> :class:`Taken`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._groups: dict[Key, dict[str, Taken]] = {}

    def add(
        self,
        key: Key,
        identifier: str,
        held: Held,
        payload: dict[str, Any],
        *,
        waiting: bool = False,
    ) -> None:
        """Record a message just delivered to this consumer (``waiting``: not returned yet)."""
        with self._lock:
            self._groups.setdefault(key, {})[identifier] = Taken(held, payload, waiting=waiting)

    def take_waiting(self, key: Key, limit: int) -> list[tuple[str, Taken]]:
        """Return up to ``limit`` reserved messages no read returned yet, oldest first."""
        with self._lock:
            waiting = sorted(
                ((i, t) for i, t in self._groups.get(key, {}).items() if t.waiting),
                key=lambda item: item[1].held.copy_id,
            )[:limit]
            for _, taken in waiting:
                taken.waiting = False
                taken.started = time.perf_counter()
            return waiting

    def get(self, key: Key, identifier: str) -> Taken | None:
        """Return what this consumer holds under ``identifier``, or None."""
        with self._lock:
            return self._groups.get(key, {}).get(identifier)

    def drop(self, key: Key, identifier: str) -> None:
        """Forget a message that was settled."""
        with self._lock:
            self._groups.get(key, {}).pop(identifier, None)

    def redeliver(self, key: Key, identifier: str) -> None:
        """Mark a held message for redelivery to this consumer (a nack)."""
        with self._lock:
            taken = self._groups.get(key, {}).get(identifier)
            if taken is not None:
                taken.redeliver = True

    def take_redeliveries(self, key: Key, limit: int) -> list[tuple[str, Taken]]:
        """Return up to ``limit`` nacked messages, oldest first, as delivered again."""
        with self._lock:
            waiting = sorted(
                ((i, t) for i, t in self._groups.get(key, {}).items() if t.redeliver),
                key=lambda item: item[1].held.copy_id,
            )[:limit]
            for _, taken in waiting:
                taken.redeliver = False
                taken.started = time.perf_counter()
                taken.held = dataclasses.replace(taken.held, deliveries=taken.held.deliveries + 1)
            return waiting

    def clear(self) -> list[Taken]:
        """Forget everything; return what was held."""
        with self._lock:
            everything = [t for group in self._groups.values() for t in group.values()]
            self._groups.clear()
            return everything
