"""The Redis side of the provider: leases, a heartbeat, Pub/Sub waiters.

A consumer reserves group copies with :class:`simplebroker_redis.Leases`
(one Lua script per state change): reserved copies stay in their queue but
nobody else can take them. A :class:`~simplebroker_redis.heartbeat.LeaseHeartbeat`
thread with its own connection renews every token this process holds, so a
handler running for hours keeps its message; when the process dies, the
lease runs out (``LEASE_SECONDS``) and any live consumer's heartbeat, or
the next reservation's upkeep, makes the copy pending again, in its place.
The backend counts deliveries and moves a copy released or recovered past
``MAX_DELIVERIES`` to the group's dead-letter queue, journaling it; the
heartbeat reads that journal and logs each such message once, whichever
process dead-lettered it.

Blocking reads sleep on the backend's activity waiters (sharded Pub/Sub):
every script that makes a message pending publishes a wake-up in the same
step, so nothing polls.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Iterator, Sequence
from typing import Any, Final

from simplebroker import BrokerTarget, QueueStats

from simplebroker_redis import Lease, Leases, OutcomeUnknown, ReplicationTimeout, calls, tasks
from simplebroker_redis.activity import QueueActivityWaiter, close_idle_listeners, open_waiter
from simplebroker_redis.calls.journal import JOURNAL_START
from simplebroker_redis.core import RedisBrokerCore
from simplebroker_redis.errors import transient
from simplebroker_redis.heartbeat import Holdings, LeaseHeartbeat, Standing
from simplebroker_redis.retry import BACKOFF_MAX, BACKOFF_MIN
from simplebroker_redis.server import Target

from .config import Settings
from .names import Layout, Parsed
from .store import Held, Store, Waiter

logger = logging.getLogger("protean_simplebroker")

#: Seconds between reads of the dead-letter journal (in the heartbeat thread).
REPORT_SECONDS: Final[float] = 5.0

#: Seconds an acknowledgement is retried while the server cannot be reached.
ACK_RETRY_SECONDS: Final[float] = 120.0


class RedisStore(Store):
    """A broker's Redis connection, reservations and waiters."""

    kind = "redis"

    def __init__(self, settings: Settings, layout: Layout) -> None:
        super().__init__(settings, layout)
        self.runner = Target(settings.target, settings.backend_options).runner(self.config)
        self.holdings = Holdings()
        self.heartbeat = LeaseHeartbeat(
            self.runner, self.holdings, settings.timing, framework="protean", on_beat=self._report
        )
        self._waiters: dict[tuple[str, ...], QueueActivityWaiter] = {}
        self._reading: set[str] = set()  #: group queues reserved from (journal filter)
        self._journal = JOURNAL_START
        self._next_report = 0.0
        #: Published messages and group copies carry task index keys.
        self.index_tasks = tasks.enabled(settings.task_index, tasks.INDEX_ENV)
        #: This process's task statistics (None: off).
        self.task_stats = (
            tasks.task_stats(self.runner) if tasks.enabled(settings.task_stats) else None
        )

    def _target(self) -> tuple[str | BrokerTarget, Any]:
        return self.runner.broker_target, self.runner

    # -- the task index ------------------------------------------------------------
    def write(
        self, queue: str, body: str, task_key: str = "", *, dedupe_key: str | None = None
    ) -> int:
        """Write ``body`` to ``queue``, indexed under ``task_key`` when the index is on.

        ``dedupe_key``: the write's idempotency key (kept ``DEDUPE_SECONDS``):
        written again with it, nothing more is stored and the first ID is
        returned (see :meth:`Store.write`).
        """
        core = self.conn
        if not isinstance(core, RedisBrokerCore):
            return int(core.write(queue, body))
        return core.write(
            queue,
            body,
            task_key=task_key if self.index_tasks else "",
            dedupe_key=dedupe_key,
            dedupe_seconds=self.settings.dedupe_seconds,
        )

    def insert(self, records: list[tuple[str, str, int]], task_keys: Sequence[str] = ()) -> None:
        """Insert messages with exact IDs, each indexed under its ``task_keys`` entry."""
        core = self.conn
        if task_keys and self.index_tasks and isinstance(core, RedisBrokerCore):
            core.insert_messages(records, task_keys=task_keys)
        else:
            core.insert_messages(records)

    @functools.cached_property
    def leases(self) -> Leases:
        """Return the reservation API (validates the namespace on first use)."""
        return Leases(self.runner)

    # -- reservations ------------------------------------------------------------
    def reserve(
        self, stream: str, group: str, limit: int, *, owned: bool
    ) -> list[tuple[Held, str]]:
        """Reserve up to ``limit`` copies under one token (see :class:`Store`)."""
        queue = self.layout.group(stream, group)
        most = self.max_deliveries
        sent = time.monotonic()
        try:
            lease = self.leases.reserve(
                queue,
                limit,
                self.settings.timing.lease_seconds,
                max_deliveries=most,
                dead_letter=self.layout.dead(stream, group) if most else None,
                holder=self.holdings.holder,
            )
        except ReplicationTimeout as exc:
            # Reserved on the primary, but a failover could undo it: hand the
            # copies back at once (uncounted) and take them when a replica answers.
            if isinstance(exc.result, Lease) and exc.result.messages:
                self._give_back(exc.result.token)
            logger.warning("reservation on %s not confirmed by a replica: %s", queue, exc)
            return []
        self.holdings.clock.observe(lease.created_ns, sent)
        self._reading.add(queue)
        if not lease.messages:
            return []
        self.holdings.hold(lease.token, len(lease.messages), lease.deadline_ns)
        self.heartbeat.start()
        return [
            (Held(stream, group, message.id, lease.token, message.deliveries), message.body)
            for message in lease.messages
        ]

    def _give_back(self, token: str) -> None:
        with contextlib.suppress(Exception):  # the lease expires anyway
            self.leases.release(token, undeliver=True)

    def ack(self, held: Held) -> bool:
        """Delete a held copy (one script); False when its lease was lost.

        A server that cannot be reached is retried (backoff up to 2 s) for
        up to ``ACK_RETRY_SECONDS``, the copy held and renewed meanwhile:
        Protean does not retry an acknowledgement, and a copy left held
        would never be settled. A try whose reply was lost may have settled
        it: a repeat that finds it gone counts as done. Past that time (or
        on an error that is not transient) the error is raised and the copy
        is let go: no longer renewed, it returns to its group when its lease
        ends and is handled again (issue 42: held and renewed for a retry
        that never comes, it was never settled).
        """
        # Settling, not let go: held until it lands, and a renewal that
        # finds the token gone because it landed reports nothing lost.
        self.holdings.settling(held.handle)
        try:
            settled, unsure = self._ack_retrying(held)
        finally:
            # Landed, or failed for good: not renewed any more either way.
            self.holdings.settled(held.handle)
        if settled == 0 and unsure:
            logger.info("message %s was acknowledged by a try whose reply was lost", held.copy_id)
            return True
        return settled == 1

    def _ack_retrying(self, held: Held) -> tuple[int, bool]:
        """Send the acknowledgement (see :meth:`ack`); return (settled, a try's outcome unknown)."""
        deadline = time.monotonic() + ACK_RETRY_SECONDS
        delay, unsure = BACKOFF_MIN, False
        while True:
            try:
                return self.leases.ack(held.handle, [held.copy_id], delete=True).settled, unsure
            except ReplicationTimeout as exc:
                logger.warning("acknowledgement not confirmed by a replica: %s", exc)
                return 1, unsure
            except Exception as exc:
                if not transient(exc) or self.stop.is_set() or time.monotonic() > deadline:
                    raise
                if delay == BACKOFF_MIN:
                    logger.warning(
                        "acknowledging message %s failed, retrying: %s", held.copy_id, exc
                    )
                unsure = unsure or isinstance(exc, OutcomeUnknown)
                self.stop.wait(delay)
                delay = min(delay * 2, BACKOFF_MAX)

    def startable(self, held: Held) -> bool | None:
        """Return whether the copy's lease still holds (see :meth:`Store.startable`)."""
        standing = self.holdings.standing(held.handle)
        if standing is Standing.HELD:
            return True
        # LET_GO cannot happen to a copy waiting here (it holds its token); if it
        # did, the copy is not this consumer's to start either.
        return False if standing is Standing.EXPIRED else None

    def release(self, held: Held, *, counted: bool) -> bool:
        """Make a held copy pending again, or dead-letter it (the script decides)."""
        self.holdings.settling(held.handle)
        try:
            done = self.leases.release(held.handle, [held.copy_id], undeliver=not counted)
        except ReplicationTimeout as exc:
            logger.warning("hand-back not confirmed by a replica: %s", exc)
            done = 1
        finally:
            # Landed, or failed: not renewed any more, the copy returns when its lease ends.
            self.holdings.settled(held.handle)
        return done == 1

    def _bury(self, held: Held) -> bool:
        """Move a held copy to the dead-letter queue (``Leases.reject``, one script)."""
        dead = self.layout.dead(held.stream, held.group)
        self.holdings.settling(held.handle)
        try:
            settled = self.leases.reject(held.handle, [held.copy_id], dead).settled
        except BaseException:
            self.holdings.unsettle(held.handle)  # still held: the caller may retry
            raise
        self.holdings.settled(held.handle)
        return settled == 1

    def recover(self, stream: str, group: str) -> None:
        """Nothing to do here: the heartbeat and every reservation's upkeep recover."""

    @contextlib.contextmanager
    def lock(self, stream: str, group: str, lock_id: int) -> Iterator[bool]:
        """Reserve the group's registration message as its copy lock."""
        lease = self.leases.reserve(
            self.layout.at(stream, group), 1, self.settings.timing.lease_seconds, exact=lock_id
        )
        if not lease.messages:
            yield False
            return
        self.holdings.hold(lease.token, 1)
        self.heartbeat.start()
        try:
            yield True
        finally:
            self.holdings.let_go(lease.token)
            self._give_back(lease.token)

    def deliveries(self, copy_id: int, stream: str, group: str) -> int:
        """Return the backend's delivery count, or the recorded one when higher.

        A consumer's redeliveries after its nacks do not reach the backend;
        a message dead-lettered by nacks has them recorded.
        """
        recorded = self.failures.count(stream, group, copy_id)
        return max(int(self.leases.deliveries(copy_id)), recorded)

    def held_count(self, queues: Sequence[tuple[Parsed, QueueStats]]) -> int:
        """Return reserved group copies: pending minus what a reservation could take."""
        groups = [stats for parsed, stats in queues if parsed.kind == "group"]
        if not groups:
            return 0
        pending = sum(stats.pending for stats in groups)
        ready = self.runner.run(calls.ready_count(self.runner.keys, [s.queue for s in groups]))
        return max(0, pending - int(ready))

    def forget_holdings(self) -> None:
        """Hand back every token this process holds (uncounted) and forget them."""
        for token in self.holdings.drop(self.holdings.tokens()):
            self._give_back(token)

    # -- the heartbeat's callback -------------------------------------------------------
    def _report(self) -> None:
        """Log each dead letter of the groups read here once (journal entries acked)."""
        now = time.monotonic()
        if now < self._next_report or not self._reading:
            return
        self._next_report = now + REPORT_SECONDS
        more = True
        while more and not self.stop.is_set():
            page = self.leases.dead_letters(sorted(self._reading), after=self._journal)
            for entry in page.entries:
                if self.leases.dead_letter_ack(entry.entry).acked:
                    logger.warning(
                        "message %s of %s dead-lettered to %s after %d deliveries",
                        entry.id,
                        entry.queue,
                        entry.dead_letter_queue,
                        entry.deliveries,
                    )
            self._journal, more = page.cursor, page.more

    # -- wake-ups and the server -------------------------------------------------------
    def waiter(self, queues: Sequence[str]) -> Waiter:
        """Return this process's Pub/Sub waiter for ``queues`` (kept for the next read)."""
        key = tuple(queues)
        found = self._waiters.get(key)
        if found is None:
            with self._guard:
                found = self._waiters.get(key)
                if found is None:
                    found = self._waiters[key] = open_waiter(self.runner, key, self.stop)
        return found

    def ping(self) -> bool:
        """Return whether the namespace's primary answers PING (one try: ``socket_timeout``)."""
        return bool(self.runner.execute(lambda client: client.ping()))

    def memory_bytes(self) -> int:
        """Return the server's ``used_memory``."""
        info = self.runner.execute(lambda client: client.info("memory"), idempotent=True)
        return int(info.get("used_memory", 0))

    def details(self) -> dict[str, Any]:
        """Return the backend kind, target (redacted) and namespace."""
        return {
            "namespace": self.settings.namespace,
            "lease_seconds": self.settings.timing.lease_seconds,
        }

    def close(self) -> None:
        """Stop the heartbeat, hand back what is held, close waiters and pools."""
        self.stop.set()
        if not self.belongs_here():
            return
        self.heartbeat.stop()
        self.forget_holdings()
        for waiter in list(self._waiters.values()):
            with contextlib.suppress(Exception):
                waiter.close()
        self._waiters.clear()
        # Close the wake-up connection now that no waiter uses it, rather than
        # let it linger and log a reconnect when the server goes away first.
        close_idle_listeners(timeout=1.0)
        super().close()
        self.runner.shutdown()
