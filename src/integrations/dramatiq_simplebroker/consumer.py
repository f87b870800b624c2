"""Dramatiq's consumer on leases: reserve, hand out, acknowledge, dead-letter, hand back.

A :class:`SimpleBrokerConsumer` belongs to one of the worker's consumer
threads (one per queue). Its ``__next__`` hands out the messages of its
prefetch window, reserving more (one ``reserve_queues`` round trip over
the queue's priority levels, highest first) only when a wake-up said there
may be some; an idle consumer sleeps on its wake-ups (:mod:`.wakeups`)
until Dramatiq's ``worker_timeout``, sending nothing. A reservation's reply
also says when the namespace's next delayed message is due: the consumer
looks again then (its reservation's upkeep promotes it), so delays need no
delay queue and no list of ETAs in memory.

``ack``, ``nack`` and ``requeue`` come from the worker threads; each is
one script. A connection failure is raised as Dramatiq's
``ConnectionClosed``, on which the worker retries an ``ack`` (and restarts
a consumer): the message stays held, and renewed, meanwhile.
"""

from __future__ import annotations

import collections
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from dramatiq.broker import Consumer, MessageProxy
from dramatiq.errors import ConnectionClosed
from dramatiq.message import Message
from dramatiq.middleware import Middleware, SkipMessage
from simplebroker.ext import OperationalError

from simplebroker_redis.codec import decode_body

from .store import Store, Taken
from .wakeups import Wakeups, close_quietly

logger = logging.getLogger("dramatiq_simplebroker")

T = TypeVar("T")


class HeldMessage(MessageProxy):
    """A message this process holds under a reservation: its token, ID and delivery count.

    ``deliveries`` is how many times the storage handed the message to a
    worker (1 the first time; more after a worker died or handed it back).
    ``result`` is set by the result backend of the same namespace
    (:mod:`.results`): the result is then stored with the acknowledgement,
    in one script.
    """

    def __init__(
        self,
        message: Message[Any],
        taken: Taken,
        dead: str,
        identity: tuple[str, str | None, str],
    ) -> None:
        super().__init__(message)
        token, leased = taken
        self.token = token
        self.identity = identity  #: the runner's: which server and namespace hold it
        self.storage_id = leased.id
        self.deliveries = leased.deliveries
        self.dead_letter_queue = dead
        #: (message key, value, ttl ms, message ID to find it by or '')
        self.result: tuple[str, str, int, str] | None = None
        self.settled = False  #: acknowledged, nacked or handed back: a result is stored alone


class LeaseFence(Middleware):
    """Skips a message whose lease this process lost before its task started.

    A worker paused past its lease (SIGSTOP, a frozen VM, a long GC) finds,
    at its heartbeat's next renewal, that its reservations were recovered
    and taken by others; messages it had handed to Dramatiq's work queue are
    then not run here (the broker calls it before every other middleware's
    ``before_process_message``).
    """

    def __init__(self, store: Store) -> None:
        self.store = store

    def before_process_message(self, broker: Any, message: Any) -> None:
        """Raise ``SkipMessage`` for a held message whose token this process no longer holds."""
        if isinstance(message, HeldMessage) and not self.store.still_held(message.token):
            logger.warning(
                "message %s (%d) not started: its lease expired meanwhile",
                message.message_id,
                message.storage_id,
            )
            raise SkipMessage("lease lost before the task started")


@contextmanager
def connection_errors() -> Iterator[None]:
    """Raise a server we cannot reach as Dramatiq's ``ConnectionClosed`` (it retries)."""
    try:
        yield
    except OperationalError as exc:
        raise ConnectionClosed(exc) from None


class SimpleBrokerConsumer(Consumer):
    """Messages of one queue (every priority level) for one of the worker's consumer threads.

    Args:
        store: The broker's storage operations.
        sources: Returns the storage queues to reserve from, in read order,
            each with its dead-letter queue (asked again whenever
            ``version`` changes: an actor of a new priority was declared).
        version: Returns the broker's count of declared actors.
        prefetch: Most messages held at once (handed out or buffered).
        timeout_ms: Longest ``__next__`` waits for a message.
        dead_letter: The queue's dead-letter queue (``nack``).

    """

    def __init__(
        self,
        store: Store,
        sources: Callable[[], Sequence[tuple[str, str | None]]],
        version: Callable[[], int],
        prefetch: int,
        timeout_ms: int,
        dead_letter: str,
    ) -> None:
        self.store = store
        self._sources_of = sources
        self._version_of = version
        self._version = version()
        self.sources = list(sources())
        self.prefetch = max(1, int(prefetch))
        self.timeout = max(0, int(timeout_ms)) / 1000
        self.dead_letter = dead_letter
        self._lock = threading.Lock()
        self._buffer: collections.deque[Taken] = collections.deque()
        self._out = 0  #: handed out, not yet acknowledged, nacked or handed back
        self._wakeups = Wakeups(store.runner, [queue for queue, _ in self.sources])
        self._due_at: float | None = None  #: monotonic time the next delayed message is due
        self._recheck_at = 0.0  #: monotonic time of the next look without a wake-up
        self._closed = False

    # -- handing out ----------------------------------------------------------------------
    def __next__(self) -> MessageProxy | None:
        """Return the next message, or None after ``timeout_ms`` without one."""
        with connection_errors():
            self._wakeups.subscribe()
            deadline = time.monotonic() + self.timeout
            while not self._closed:
                held = self._hand_out()
                if held is not None:
                    return held
                room = self._room()
                if self._batch_ready(room) and self._worth_a_look():
                    if self._reserve(room):
                        continue
                now = time.monotonic()
                if now >= deadline:
                    return None
                until = min(deadline, self._due_at or deadline, self._recheck_at)
                self._wakeups.wait(until - now, wakeups=self._batch_ready(room))
            return None

    def _room(self) -> int:
        with self._lock:
            return self.prefetch - self._out - len(self._buffer)

    def _batch_ready(self, room: int) -> bool:
        """Return True when a reservation is worth its round trip now.

        With messages still running, the consumer waits until half its
        window is free, so that a busy queue is reserved in batches rather
        than one message per acknowledgement (the worker's threads still
        hold the other half).
        """
        if room <= 0:
            return False
        with self._lock:
            running = self._out
        return running == 0 or room >= max(1, self.prefetch // 2)

    def _worth_a_look(self) -> bool:
        """Return True when a reservation may find something: a wake-up, a due time, a recheck."""
        if self._version != self._version_of():
            self._version = self._version_of()
            self.sources = list(self._sources_of())
            self._wakeups.watch([queue for queue, _ in self.sources])
        now = time.monotonic()
        woken = self._wakeups.take()
        return (
            woken or now >= self._recheck_at or (self._due_at is not None and now >= self._due_at)
        )

    def _reserve(self, room: int) -> bool:
        taken, due_in = self.store.reserve(self.sources, room)
        now = time.monotonic()
        self._due_at = None if due_in is None else now + due_in
        self._recheck_at = now + self.store.settings.idle_recheck
        if len(taken) >= room:
            self._wakeups.wake()  # a full batch: there may be more once there is room
        with self._lock:
            self._buffer.extend(taken)
        return bool(taken)

    def _hand_out(self) -> HeldMessage | None:
        while True:
            with self._lock:
                if not self._buffer:
                    return None
                token, leased = self._buffer.popleft()
                self._out += 1
            if not self.store.holdings.holds(token):
                # The heartbeat found its lease gone (the process was paused
                # past it): another worker may run it now, so this one must not.
                logger.warning("message %d not started: its lease expired meanwhile", leased.id)
                with self._lock:
                    self._out -= 1
                continue
            try:
                message = Message.decode(decode_body(leased.body))
            except Exception as exc:  # noqa: BLE001 - any decoder's error: the body is unreadable
                logger.error(
                    "message %d is not a Dramatiq message (%s): moved to %s",
                    leased.id,
                    exc,
                    self.dead_letter,
                )
                self._settle(
                    functools.partial(self.store.dead_letter, token, leased.id, self.dead_letter)
                )
                continue
            return HeldMessage(
                message, (token, leased), self.dead_letter, self.store.runner.identity
            )

    # -- settling (the worker threads) -------------------------------------------------------
    @property
    def outstanding_message_count(self) -> int:
        """Return the messages held: handed out and unsettled, or buffered (RedisBroker's name)."""
        with self._lock:
            return self._out + len(self._buffer)

    def ack(self, message: MessageProxy) -> None:
        """Delete the message (with its result, when the result backend left one)."""
        held = _held(message)
        if held is None:
            return
        if held.result is None:
            done = self._settle(lambda: self.store.ack(held.token, held.storage_id))
        else:
            key, value, ttl, task_id = held.result
            stored = self._settle(
                lambda: self.store.ack_with_result(
                    held.token, held.storage_id, key, value, ttl, task_id
                )
            )
            done = stored.settled == 1
            held.result = None
        held.settled = True
        if not done:
            logger.warning(
                "message %s (%d) was acknowledged after its lease expired: another worker "
                "may have run it too",
                held.message_id,
                held.storage_id,
            )

    def nack(self, message: MessageProxy) -> None:
        """Move the message to the queue's dead-letter queue (kept ``dead_message_ttl``)."""
        held = _held(message)
        if held is None:
            return
        self._flush_result(held)
        done = self._settle(
            lambda: self.store.dead_letter(held.token, held.storage_id, held.dead_letter_queue)
        )
        held.settled = True
        if not done:
            logger.warning(
                "message %s (%d) was rejected after its lease expired",
                held.message_id,
                held.storage_id,
            )

    def _flush_result(self, held: HeldMessage) -> None:
        """Store a result the backend left on a message that is not acknowledged after all."""
        if held.result is not None:
            key, value, ttl, task_id = held.result
            with connection_errors():
                self.store.store_result(key, value, ttl, task_id)
            held.result = None

    def _settle(self, operation: Callable[[], T]) -> T:
        with connection_errors():
            done = operation()
        with self._lock:
            self._out -= 1
        self._wakeups.nudge()
        return done

    def requeue(self, messages: Iterable[MessageProxy]) -> None:
        """Hand messages back, pending again at once and their delivery not counted."""
        groups: dict[str, list[int]] = {}
        count = 0
        for message in messages:
            held = _held(message)
            if held is None:
                continue
            held.settled = True
            groups.setdefault(held.token, []).append(held.storage_id)
            count += 1
        if not groups:
            return
        with connection_errors():
            self.store.release_groups(groups, undeliver=True)
        with self._lock:
            self._out = max(0, self._out - count)
        self._wakeups.nudge()

    def close(self) -> None:
        """Hand back what was reserved but not handed out; drop the wake-ups."""
        self._closed = True
        with self._lock:
            buffered, self._buffer = list(self._buffer), collections.deque()
        groups: dict[str, list[int]] = {}
        for token, leased in buffered:
            groups.setdefault(token, []).append(leased.id)
        try:
            self.store.release_groups(groups, undeliver=True)
        except OperationalError as exc:  # their leases expire: nothing is lost
            logger.warning("could not hand back %d message(s) at close: %s", len(buffered), exc)
        close_quietly(self._wakeups)


def _held(message: object) -> HeldMessage | None:
    """Return ``message`` if this package's consumer handed it out, else None (logged).

    Dramatiq's RedisBroker ignores a settlement of a message it does not
    know (its issue #320); so does this one.
    """
    if isinstance(message, HeldMessage):
        return message
    logger.warning("ignored the settlement of a message no consumer here holds: %r", message)
    return None
