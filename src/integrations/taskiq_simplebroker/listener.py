"""The listen loop: reserve with leases, yield tasks, sleep on wake-ups.

One :class:`TaskListener` serves one ``broker.listen()`` call. When its buffer
is empty (Taskiq asks for a message only when it has room to run it) it
reserves up to ``prefetch`` messages in one round trip. A listener reads
one or several *sources* (queues) in strict order: a queue's priority
queues, highest first, then the queue itself, then the next listened queue
(see :mod:`.priorities`); several sources are reserved in one round trip
too (``reserve_queues``, one token per queue that gave messages). Once a
reservation comes back short (the sources are empty) it sleeps on their
Pub/Sub wake-up channels (every write, release and recovery publishes there; see
:class:`simplebroker_redis.activity.AsyncActivity`) until woken, until the next
delayed message is due, or for at most :data:`IDLE_RECHECK` seconds: there
is no polling loop.

A redelivered message on its last allowed delivery (``max_deliveries``)
runs alone: the rest of its reservation is handed back, and it is yielded
once nothing else of the listener is in flight. Every worker crash counts as
a delivery of each message the worker held, so without this a poison task
would take the innocent tasks reserved with it to the dead-letter queue.

A buffered message is yielded only while this worker's lease on it holds:
one whose token the heartbeat found lost (another worker recovered it) is
dropped, and one whose lease's known deadline passed by the server's
clock, as estimated here (the process was stopped, or cut off from the
server, past its lease) is handed back unstarted (see
:meth:`~simplebroker_redis.holdings.Holdings.standing`).

Closing the generator (Taskiq does so on shutdown) hands the messages it
reserved but did not yield back at once, with their delivery count
restored. A reservation interrupted by cancellation is completed and handed
back too, so cancellation never strands a message until its lease expires.
Transient storage errors (server restarting, timeouts) are retried with
exponential backoff from 100 ms to 2 s; anything else propagates. A worker
whose server did not answer at start-up (the broker logged that once)
waits here for it before it subscribes, reserves or starts its heartbeat.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, deque
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from functools import partial
from typing import Any, Final

from taskiq.acks import AckableMessage

from simplebroker_redis import ReplicationTimeout
from simplebroker_redis.activity import AsyncActivity
from simplebroker_redis.holdings import Standing
from simplebroker_redis.types import Lease, LeasedMessage, MultiLease

from .codec import decode_body
from .deliveries import task_id_of
from .errors import BACKOFF_MAX, BACKOFF_MIN, is_transient
from .runtime import PrefetchWindow, Runtime

logger = logging.getLogger("taskiq_simplebroker")

#: Longest sleep (seconds) of an idle listener between two reservations.
#: Wake-ups are hints; this bounds the cost of one lost during an outage.
IDLE_RECHECK: Final[float] = 10.0

#: Longest slice of that sleep: bounds how late a worker notices a shutdown signal.
TICK: Final[float] = 1.0

#: Added to a delayed message's due time, so the listener wakes after it.
DUE_SLACK: Final[float] = 0.002

Messages = tuple[LeasedMessage, ...]

#: A reserved message: its token, the message, and its dead-letter queue.
Held = tuple[str, LeasedMessage, str]


class TaskListener:
    """Reserves messages of one queue and yields them as ``AckableMessage``."""

    def __init__(
        self,
        runtime: Runtime,
        *,
        sources: Sequence[tuple[str, str]],
        prefetch: int,
        lease_seconds: float,
        max_deliveries: int | None,
        name: str | None = None,
        ready: Callable[[], Awaitable[None]] | None = None,
        task_id: Callable[[bytes], str] | None = None,
    ) -> None:
        self.runtime = runtime
        self._ready = ready
        self._task_id = task_id  #: the task ID of a body Taskiq's JSON formatter did not write
        self.sources = list(sources)  #: (queue, dead-letter queue), in reservation order
        self.queue = name or ", ".join(queue for queue, _ in self.sources)
        self.lease_seconds = lease_seconds
        self.max_deliveries = max_deliveries
        self.window = PrefetchWindow(prefetch)
        self._buffer: deque[Held] = deque()
        self._wakeups = AsyncActivity(runtime.runner, [queue for queue, _ in self.sources])
        self._failing = False
        self._drained = False  #: the last reservation found the sources empty
        self._due_at: float | None = None  #: when the next delayed message is due

    async def messages(self) -> AsyncGenerator[AckableMessage, None]:
        """Yield messages until closed or cancelled."""
        buffer = self._buffer
        ack = self.runtime.ack
        window = self.window
        try:
            await self._until_ready()
            await self.runtime.start()
            logger.info(
                "listening on %s at %s: up to %d task(s) reserved ahead of Taskiq; "
                "how many run at once is taskiq worker --max-async-tasks",
                self.queue,
                self.runtime.runner.where,
                self.window.size,
            )
            # Subscribe before the first reservation, so no wake-up is missed.
            await self._wakeups.start()
            while True:
                if not buffer:
                    await self._fill()
                    continue
                if self.runtime.holdings.standing(buffer[0][0]) is not Standing.HELD:
                    await self._drop_stale()
                    continue
                held = buffer.popleft()
                token, message, dead = held
                if message.id == window.alone:
                    try:
                        await window.wait_until_alone()
                    except BaseException:
                        buffer.appendleft(held)  # handed back on close
                        raise
                    if self.runtime.holdings.standing(token) is not Standing.HELD:
                        buffer.appendleft(held)  # dropped or handed back next round
                        continue
                try:
                    data = decode_body(message.body)
                except ValueError:
                    self._dead_letter_damaged(token, message, dead)
                    continue
                task_id = task_id_of(data, self._task_id)
                if task_id is not None:
                    self.runtime.deliveries.add(task_id, token, message.id)
                # model_construct: both fields are built here, skip validation.
                yield AckableMessage.model_construct(
                    data=data, ack=partial(ack, window, token, message.id, dead, task_id)
                )
        finally:
            await self._close()

    async def _drop_stale(self) -> None:
        """Take every buffered message whose lease is no longer this worker's out of the buffer.

        A lost one (the heartbeat found its token gone: another worker
        recovered it) is dropped; an expired one (its known deadline passed,
        see :meth:`~simplebroker_redis.holdings.Holdings.standing`) is
        handed back unstarted, its delivery taken back; one this worker let
        go of already is dropped quietly. Logged once per call.
        """
        holdings = self.runtime.holdings
        kept: deque[Held] = deque()
        expired: dict[str, list[int]] = {}
        lost = 0
        for held in self._buffer:
            token, message, _ = held
            standing = holdings.standing(token)
            if standing is Standing.HELD:
                kept.append(held)
                continue
            self.window.done(message.id)
            if standing is Standing.EXPIRED:
                expired.setdefault(token, []).append(message.id)
            elif standing is Standing.LOST:
                lost += 1
            # LET_GO: this worker handed it back already; nothing was lost.
        self._buffer.clear()
        self._buffer.extend(kept)
        if expired:
            count = sum(len(ids) for ids in expired.values())
            logger.warning(
                "%d prefetched task(s) of %s not started: their lease ran out while this "
                "worker was stopped or cut off from the server; handed back",
                count,
                self.queue,
            )
            await self.runtime.hand_back(expired.items(), undeliver=True)
        if lost:
            logger.warning(
                "%d prefetched task(s) of %s not started: another worker recovered them "
                "after their lease ran out",
                lost,
                self.queue,
            )

    async def _until_ready(self) -> None:
        """Wait until the server answers the broker's start-up check."""
        if self._ready is None:
            return
        delay = BACKOFF_MIN
        waited = False
        while True:
            try:
                await self._ready()
            except Exception as exc:
                if not is_transient(exc):
                    raise
                # The broker's start-up logged this outage once already.
                logger.debug("still waiting for %s: %s", self.runtime.runner.where, exc)
                waited = True
                await asyncio.sleep(delay)
                delay = min(delay * 2, BACKOFF_MAX)
                continue
            if waited:
                logger.info("%s answers; starting to take tasks", self.runtime.runner.where)
            return

    async def _fill(self) -> None:
        delay = BACKOFF_MIN
        while True:
            await self.window.wait_for_room()
            try:
                if self._drained:
                    # The last reservation emptied the queue: ask again only
                    # after a wake-up (or when a delayed message is due).
                    await self._sleep()
                    self._drained = False
                limit = self.window.room
                lease = await self._reserve(limit)
            except Exception as exc:
                if not is_transient(exc):
                    raise
                self._failed(exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, BACKOFF_MAX)
                continue
            self._healthy()
            delay = BACKOFF_MIN
            self._drained = len(lease.messages) < limit
            if lease.next_due_seconds is None:
                self._due_at = None
            else:
                self._due_at = time.monotonic() + lease.next_due_seconds + DUE_SLACK
            if lease.messages:
                return

    async def _reserve(self, limit: int) -> Lease | MultiLease:
        # Shielded: a cancelled caller waits for the reservation to finish
        # and hands it back, instead of stranding it until its lease expires.
        call = asyncio.ensure_future(self._reserve_batch(limit))
        try:
            reserved, held, last = await asyncio.shield(call)
        except asyncio.CancelledError:
            await self._abandon(call)
            raise
        if held:
            deadline = reserved.deadline_ns
            for token, count in Counter(token for token, _, _ in held).items():
                self.runtime.holdings.hold(token, count, deadline)
            self.window.take(len(held))
            if last is not None:
                self.window.alone = last.id
            self._buffer.extend(held)
        return reserved

    async def _reserve_batch(
        self, limit: int
    ) -> tuple[Lease | MultiLease, list[Held], LeasedMessage | None]:
        """Reserve; keep only a message on its last delivery when there is one.

        A reservation that raised ``ReplicationTimeout`` (``wait_replicas``)
        happened on the primary, but a failover could still lose it and let
        another worker run its tasks while this one does. Its tasks are
        handed back, their delivery not counted, and the listener tries again
        after its backoff. Stranding them until their lease expired would
        count a delivery each time: the oldest tasks, reserved first, would
        go to the dead-letter queue after a few failovers without running.
        """
        try:
            reserved = await self._reservation(limit)
        except ReplicationTimeout as exc:
            if isinstance(exc.result, Lease | MultiLease):
                await self.runtime.hand_back(_batches(exc.result), undeliver=True)
            raise
        dead_of = dict(self.sources)
        held = [
            (lease.token, message, dead_of[lease.queue])
            for lease in _parts(reserved)
            for message in lease.messages
        ]
        last = self._last_delivery(tuple(message for _, message, _ in held))
        if last is not None and len(held) > 1:
            others: dict[str, list[int]] = {}
            for token, message, _ in held:
                if message is not last:
                    others.setdefault(token, []).append(message.id)
            await self.runtime.hand_back(others.items(), undeliver=True)
            held = [item for item in held if item[1] is last]
        return reserved, held, last

    async def _reservation(self, limit: int) -> Lease | MultiLease:
        leases, holdings = self.runtime.leases, self.runtime.holdings
        sent = time.monotonic()
        reserved: Lease | MultiLease
        if len(self.sources) == 1:
            [(queue, dead)] = self.sources
            reserved = await leases.reserve(
                queue,
                limit,
                self.lease_seconds,
                max_deliveries=self.max_deliveries,
                dead_letter=dead if self.max_deliveries else None,
                holder=holdings.holder,
            )
        else:
            reserved = await leases.reserve_queues(
                [(queue, dead if self.max_deliveries else None) for queue, dead in self.sources],
                limit,
                self.lease_seconds,
                max_deliveries=self.max_deliveries,
                holder=holdings.holder,
            )
        holdings.clock.observe(reserved.created_ns, sent)
        return reserved

    def _last_delivery(self, messages: Messages) -> LeasedMessage | None:
        """Return a redelivered message on its last allowed delivery, if any.

        Such a message runs alone: if it is a poison pill that takes its
        worker down, no innocent message shares its fate (each crash counts
        as a delivery of every message the worker held).
        """
        limit = self.max_deliveries
        if limit is None or limit < 2:
            return None
        for message in messages:
            if message.deliveries >= limit:
                return message
        return None

    async def _abandon(self, call: asyncio.Future[tuple[Any, list[Held], Any]]) -> None:
        """Finish a reservation whose caller was cancelled, and hand it back."""
        try:
            _, held, _ = await call
        except Exception:  # noqa: BLE001 - nothing was reserved, or it expires
            return
        batches: dict[str, list[int]] = {}
        for token, message, _ in held:
            batches.setdefault(token, []).append(message.id)
        if batches:
            await self.runtime.hand_back(batches.items(), undeliver=True)

    async def _sleep(self) -> None:
        """Sleep until a wake-up, the next due time, or IDLE_RECHECK seconds."""
        now = time.monotonic()
        deadline = now + IDLE_RECHECK
        if self._due_at is not None:
            deadline = min(deadline, self._due_at)
        # Short slices: Taskiq's worker sets its shutdown event from a plain
        # signal handler, which an event loop asleep in select() only sees
        # when something else wakes it (a timer costs no server command).
        while (remaining := deadline - time.monotonic()) > 0:
            if await self._wakeups.wait(min(remaining, TICK)):
                return

    def _dead_letter_damaged(self, token: str, message: LeasedMessage, dead: str) -> None:
        logger.error(
            "message %d of queue %s is not a readable task; moved to %s",
            message.id,
            self.queue,
            dead,
        )
        self.window.done(message.id)
        self.runtime.settle_later(token, message.id, dead)

    async def _close(self) -> None:
        batches: dict[str, list[int]] = {}
        while self._buffer:
            token, message, _ = self._buffer.popleft()
            batches.setdefault(token, []).append(message.id)
            if message.id == self.window.alone:
                self.window.alone = None
        try:
            if batches:
                self.window.free(sum(len(ids) for ids in batches.values()))
                count = await self.runtime.hand_back(batches.items(), undeliver=True)
                logger.info("handed back %d prefetched task(s) of %s", count, self.queue)
        finally:
            await self._wakeups.close()

    def _failed(self, exc: BaseException, delay: float) -> None:
        if not self._failing:
            logger.warning("listening on %s failed, retrying: %s", self.queue, exc)
        else:
            logger.debug("listening on %s still failing (next try in %.1f s)", self.queue, delay)
        self._failing = True

    def _healthy(self) -> None:
        if self._failing:
            logger.info("listening on %s again", self.queue)
        self._failing = False


def _parts(reserved: Lease | MultiLease) -> tuple[Lease, ...]:
    """Return a reservation's leases: one per queue (``reserve_queues``), or itself."""
    return reserved.leases if isinstance(reserved, MultiLease) else (reserved,)


def _batches(reserved: Lease | MultiLease) -> list[tuple[str, list[int]]]:
    """Return a reservation's (token, IDs) pairs, for ``Runtime.hand_back``."""
    return [(lease.token, list(lease.ids)) for lease in _parts(reserved) if lease.messages]
