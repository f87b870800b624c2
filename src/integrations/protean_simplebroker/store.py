"""What the provider needs from a backend: queues, reservations, locks, wake-ups.

:class:`Store` holds one SimpleBroker connection (``open_broker``) for the
operations both backends share (write, peek, broadcast, move, delete,
listing). Its two subclasses add what differs:

- :class:`~.redis_store.RedisStore`: reservations with renewable leases
  (``simplebroker_redis.Leases``), a heartbeat thread, Pub/Sub waiters;
- :class:`~.sqlite_store.SqliteStore`: reservations as moves into a queue
  of the consumer's own, whose liveness is an OS file lock; wake-ups from
  SQLite's data version.

Both give a reservation the same rules: a message is held by one consumer
at a time; while that consumer lives nobody else receives it; once it dies
the message is pending again in its group, in its place (same ID); after
``max_deliveries`` deliveries it goes to the group's dead-letter queue.
"""

from __future__ import annotations

import contextlib
import os
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

from simplebroker import BrokerTarget, QueueStats, open_broker
from simplebroker.ext import BrokerConnection

from simplebroker_redis.server import environment_config
from simplebroker_redis.tasks import TaskStats
from simplebroker_redis.validation import message_size_limit

from .config import Settings
from .failures import FailureRecords
from .names import Layout, Parsed


@dataclass(frozen=True, slots=True)
class Held:
    """One reserved group copy, and what settles it."""

    stream: str
    group: str
    copy_id: int  #: SimpleBroker ID of the copy (not the Protean identifier)
    handle: str  #: Redis: the reservation token; SQLite: the consumer's held queue
    deliveries: int = 1  #: this delivery's number (reservations and redeliveries so far)


_Rows = list[tuple[str, int]]


class Waiter(Protocol):
    """Something a blocking read sleeps on until a queue may have work."""

    def wait(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds; True when woken by activity."""
        ...


class Store(ABC):
    """One backend connection of one broker (see the module docstring)."""

    kind: str = ""
    #: This process's task statistics (Redis, unless turned off; None: not kept).
    task_stats: TaskStats | None = None

    def __init__(self, settings: Settings, layout: Layout) -> None:
        self.settings = settings
        self.layout = layout
        #: SimpleBroker's configuration from the environment (BROKER_*), as
        #: its CLI reads it, so limits agree with what ``broker`` enforces.
        self.config = environment_config()
        self.max_message_size = message_size_limit(self.config)
        #: Deliveries after which a copy is dead-lettered (None: never); the
        #: broker may change it (Protean's ``_max_retries``).
        self.max_deliveries: int | None = settings.max_deliveries
        self.stop = threading.Event()
        self._pid = os.getpid()
        self._guard = threading.Lock()
        self._stack: contextlib.ExitStack | None = None
        self._conn: BrokerConnection | None = None
        self.failures = FailureRecords(layout, self.peek, lambda: self.conn)

    # -- the task index (Redis only; see RedisStore) ----------------------------
    def write(
        self, queue: str, body: str, task_key: str = "", *, dedupe_key: str | None = None
    ) -> int:
        """Write ``body`` to ``queue``; return its ID (``task_key``: its task index key).

        ``dedupe_key``: an idempotency key (Redis): a second write with it
        within ``DEDUPE_SECONDS`` stores nothing and returns the first ID.
        SQLite ignores it (a local write never loses its reply).
        """
        return int(self.conn.write(queue, body))

    def insert(self, records: list[tuple[str, str, int]], task_keys: Sequence[str] = ()) -> None:
        """Insert messages with exact IDs, all or nothing (``task_keys``: one per record)."""
        self.conn.insert_messages(records)

    # -- the shared connection -------------------------------------------------
    @abstractmethod
    def _target(self) -> tuple[str | BrokerTarget, Any]:
        """Return what ``open_broker`` takes: the target and a runner (or None)."""

    @property
    def conn(self) -> BrokerConnection:
        """Return the connection every shared queue operation goes through."""
        conn = self._conn
        if conn is not None:
            return conn
        with self._guard:
            if self._conn is None:
                target, runner = self._target()
                stack = contextlib.ExitStack()
                self._conn = stack.enter_context(open_broker(target, runner, config=self.config))
                self._stack = stack
            return self._conn

    # Typed forms of the connection's row-returning calls (with_timestamps=True
    # always: the protocol types both shapes).
    def peek(
        self,
        queue: str,
        limit: int,
        *,
        after: int | None = None,
        before: int | None = None,
        order: str = "oldest",
    ) -> list[tuple[str, int]]:
        """Return up to ``limit`` ``(body, id)`` rows of ``queue`` without changing them."""
        rows = self.conn.peek_many(
            queue, limit, after_timestamp=after, before_timestamp=before, order=order
        )
        return [(str(body), int(message_id)) for body, message_id in cast(_Rows, rows)]

    def peek_exact(self, queue: str, message_id: int) -> str | None:
        """Return the body of message ``message_id`` of ``queue``, or None."""
        row = self.conn.peek_one(queue, exact_timestamp=message_id)
        return None if row is None else str(cast(tuple[str, int], row)[0])

    def move(self, source: str, target: str, limit: int) -> list[tuple[str, int]]:
        """Move the ``limit`` oldest pending messages of ``source`` to ``target`` (same IDs)."""
        rows = self.conn.move_many(source, target, limit)
        return [(str(body), int(message_id)) for body, message_id in cast(_Rows, rows)]

    def move_exact(self, source: str, target: str, message_id: int) -> bool:
        """Move message ``message_id`` of ``source`` to ``target``; False if not there."""
        return self.conn.move_one(source, target, exact_timestamp=message_id) is not None

    def belongs_here(self) -> bool:
        """Return whether this store was made in the running process (not a fork parent)."""
        return self._pid == os.getpid()

    # -- reservations ------------------------------------------------------------
    @abstractmethod
    def reserve(
        self, stream: str, group: str, limit: int, *, owned: bool
    ) -> list[tuple[Held, str]]:
        """Reserve up to ``limit`` copies of the group, oldest first: ``(held, body)``."""

    @abstractmethod
    def ack(self, held: Held) -> bool:
        """Consume a held copy; False when it was no longer held."""

    def startable(self, held: Held) -> bool | None:
        """Return whether a held copy may be started now: True yes, False expired, None lost.

        Asked right before a copy goes to its handler. Redis: False when
        the lease's known deadline passed by the server's clock (the process
        was stopped, or cut off, past its lease: hand the copy back
        unstarted), None when the heartbeat found its token gone (another
        consumer has it). SQLite: always True (a held copy is this
        consumer's for as long as the process lives).
        """
        return True

    @abstractmethod
    def release(self, held: Held, *, counted: bool) -> bool:
        """Hand a held copy back (or dead-letter it past max deliveries).

        ``counted``: the delivery counts toward ``max_deliveries`` (a nack
        outside a Protean subscription); uncounted, it is as if never made.
        """

    def bury(self, held: Held, deliveries: int | None = None) -> bool:
        """Move a held copy straight to its group's dead-letter queue.

        ``deliveries``: how many it used up, when the caller counted them
        (kept as failure records, reported by ``dlq_list``).
        """
        if deliveries is not None:
            self.failures.top_up(held.stream, held.group, held.copy_id, deliveries)
        return self._bury(held)

    @abstractmethod
    def _bury(self, held: Held) -> bool:
        """Move a held copy to its group's dead-letter queue (one atomic step)."""

    def recorded_failures(self, held: Held) -> int:
        """Return failed deliveries of the copy stored beside it (SQLite), not in ``held``."""
        return 0

    @abstractmethod
    def recover(self, stream: str, group: str) -> None:
        """Give back what dead consumers of the group held (rate-limited)."""

    @abstractmethod
    def lock(
        self, stream: str, group: str, lock_id: int
    ) -> contextlib.AbstractContextManager[bool]:
        """Hold the group's copy lock (yields False when someone else holds it)."""

    @abstractmethod
    def deliveries(self, copy_id: int, stream: str, group: str) -> int:
        """Return how often a copy has been delivered (for dead-letter reports)."""

    @abstractmethod
    def held_count(self, queues: Sequence[tuple[Parsed, QueueStats]]) -> int:
        """Return how many copies consumers hold now, given every queue's stats."""

    # -- wake-ups -------------------------------------------------------------------
    @abstractmethod
    def waiter(self, queues: Sequence[str]) -> Waiter:
        """Return a waiter woken when one of ``queues`` may have pending work.

        Made *before* the queues are checked, so work that arrives between
        the check and the wait still wakes it.
        """

    def notify(self, queue: str) -> None:  # noqa: B027 - optional: Redis wakes by itself
        """Tell this process's waiters that ``queue`` has pending work."""

    # -- the server ------------------------------------------------------------------
    @abstractmethod
    def ping(self) -> bool:
        """Return whether the backend answers."""

    @abstractmethod
    def memory_bytes(self) -> int:
        """Return the storage the backend uses (server memory, or file size)."""

    def details(self) -> dict[str, Any]:
        """Return backend facts for health reports."""
        return {}

    def forget_holdings(self) -> None:  # noqa: B027 - optional: SQLite keeps nothing
        """Drop what this process holds without settling it (after ``_data_reset``)."""

    def close(self) -> None:
        """Close the connection (only in the process that opened it)."""
        self.stop.set()
        stack, self._stack, self._conn = self._stack, None, None
        if stack is not None and self.belongs_here():
            stack.close()


def chunks(items: Sequence[int], size: int = 500) -> Iterator[list[int]]:
    """Yield ``items`` in lists of at most ``size``."""
    for start in range(0, len(items), size):
        yield list(items[start : start + size])
