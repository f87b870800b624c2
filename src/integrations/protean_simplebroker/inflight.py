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

Protean's engine runs every handler on its event loop, one at a time, and
its subscriptions read in threads meanwhile: a message a read returned
while another subscription's handler ran waits for that handler, checked
but not started, and a process stopped then (SIGSTOP, a GC pause) past
its lease would start it after waking (issue 42). So a message a read of
an owned group returned counts as *in a handler* (``busy``) until it is
settled, nacked, or its subscription reads again (a subscription reads
only after it handled what it read), and such a read first waits
(:meth:`InFlight.wait_idle`) until no other subscription's message is.
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
    busy: bool = False  #: returned by a read of an owned group, not settled: in a handler


class InFlight:
    """Thread-safe map of (stream, group) -> identifier -> :class:`Taken`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)  #: notified when a busy message is not
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

    def handed(self, key: Key, identifiers: list[str]) -> None:
        """Note that a read of an owned group returned ``identifiers``: in a handler now."""
        with self._lock:
            group = self._groups.get(key, {})
            for identifier in identifiers:
                if identifier in group:
                    group[identifier].busy = True

    def wait_idle(self, key: Key, until: float) -> bool:
        """Wait until no message of another group than ``key`` is in a handler; False at ``until``.

        ``until``: a ``time.monotonic()`` reading (now or earlier: no wait).
        The group ``key`` reads again, so none of its own is in a handler.
        """
        with self._idle:
            for taken in self._groups.get(key, {}).values():
                taken.busy = False
            while any(
                taken.busy
                for other, group in self._groups.items()
                if other != key
                for taken in group.values()
            ):
                remaining = until - time.monotonic()
                if remaining <= 0:
                    return False
                self._idle.wait(remaining)
            return True

    def get(self, key: Key, identifier: str) -> Taken | None:
        """Return what this consumer holds under ``identifier``, or None."""
        with self._lock:
            return self._groups.get(key, {}).get(identifier)

    def drop(self, key: Key, identifier: str) -> None:
        """Forget a message that was settled."""
        with self._lock:
            self._groups.get(key, {}).pop(identifier, None)
            self._idle.notify_all()

    def redeliver(self, key: Key, identifier: str) -> None:
        """Mark a held message for redelivery to this consumer (a nack)."""
        with self._lock:
            taken = self._groups.get(key, {}).get(identifier)
            if taken is not None:
                taken.redeliver, taken.busy = True, False
                self._idle.notify_all()

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
            self._idle.notify_all()
            return everything
