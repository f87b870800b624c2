"""What the broker does on the server: write, reserve, settle, dead-letter; the heartbeat.

A message a consumer hands to Dramatiq is *reserved* (``reserve_queues``,
one script over the queue's priority levels): it stays in its queue
(``broker list`` counts it) but no other worker can take it until this
process acknowledges it (deleted), nacks it (moved to ``<queue>.XQ``) or
hands it back (``requeue``, a closed consumer), or until its lease expires
because the process died. One :class:`~simplebroker_redis.heartbeat.LeaseHeartbeat`
per broker (so per worker process) renews everything the process holds,
recovers expired reservations of dead workers and keeps the worker's
record for the dashboard; now and then it also expires dead messages older
than ``dead_message_ttl``. Every state change is one of the backend's
scripts (``docs/architecture.md``); the two of Dramatiq's own are in
:mod:`simplebroker_redis.calls.dramatiq`.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Final

from simplebroker_redis import Leases, RedisBrokerCore, RedisRunner, ReplicationTimeout
from simplebroker_redis.calls import dramatiq as room
from simplebroker_redis.calls import stats
from simplebroker_redis.errors import ReservationConflict
from simplebroker_redis.heartbeat import Holdings, LeaseHeartbeat
from simplebroker_redis.types import LeasedMessage, MultiLease

from .config import Settings

logger = logging.getLogger("dramatiq_simplebroker")

#: Seconds between two expiry passes over dead messages (in the heartbeat thread).
EXPIRE_SECONDS: Final[float] = 60.0

#: Dead messages one expiry round trip deletes at most.
EXPIRE_BATCH: Final[int] = 500

#: Messages one flush round trip removes.
FLUSH_BATCH: Final[int] = 1000

#: Lease of the reservations a flush deletes at once.
FLUSH_LEASE: Final[float] = 60.0

#: A reserved message: its token, its storage ID and body, how often it was delivered.
Taken = tuple[str, LeasedMessage]


class Store:
    """One broker's storage operations, its holdings and their heartbeat."""

    def __init__(self, settings: Settings, runner: RedisRunner | None = None) -> None:
        self.settings = settings
        self.runner = runner if runner is not None else settings.target.runner()
        self.holdings = Holdings()
        self.queues: set[str] = set()  #: the queues this process consumes (its record)
        self.dead_message_ttl = settings.dead_message_ttl  #: ms (the broker's attribute sets it)
        self._heartbeat: LeaseHeartbeat | None = None
        self._lock = threading.Lock()
        self._next_expiry = 0.0
        self.beat_at = time.monotonic()  #: when the heartbeat last renewed what is held

    @functools.cached_property
    def core(self) -> RedisBrokerCore:
        """Return the SimpleBroker connection used for writes and deletes."""
        return RedisBrokerCore(self.runner)

    @functools.cached_property
    def leases(self) -> Leases:
        """Return the reservation API (validates the namespace on first use)."""
        return Leases(self.runner)

    # -- the heartbeat --------------------------------------------------------------------
    def start_heartbeat(self) -> None:
        """Renew what this process holds, and recover expired leases, from now on."""
        with self._lock:
            if self._heartbeat is None:
                self._heartbeat = LeaseHeartbeat(
                    self.runner,
                    self.holdings,
                    self.settings.timing,
                    framework="dramatiq",
                    on_beat=self._on_beat,
                    describe=lambda: {"queues": sorted(self.queues)},
                )
            self._heartbeat.start()

    @property
    def heartbeat(self) -> LeaseHeartbeat | None:
        """Return the heartbeat, once a consumer started it."""
        return self._heartbeat

    def _on_beat(self) -> None:
        """Note the renewal; expire old dead messages every :data:`EXPIRE_SECONDS`.

        Called by the heartbeat thread after each successful renewal.
        """
        now = self.beat_at = time.monotonic()
        if now < self._next_expiry:
            return
        self._next_expiry = now + EXPIRE_SECONDS
        ttl = self.dead_message_ttl
        while self.runner.run(
            room.dramatiq_dead(self.runner.keys, ttl, expire=EXPIRE_BATCH)
        ).expired:
            pass

    def close(self) -> None:
        """Stop the heartbeat (what is still held expires, or was handed back)."""
        with self._lock:
            heartbeat, self._heartbeat = self._heartbeat, None
        if heartbeat is not None:
            heartbeat.stop()

    # -- writes ---------------------------------------------------------------------------
    def write(self, queue: str, body: str, delay_ms: int | None, task_key: str = "") -> int:
        """Write ``body`` to ``queue`` (storage name), claimable after ``delay_ms``; its ID.

        ``task_key`` indexes it under its Dramatiq message ID ('' for none).
        """
        if delay_ms:
            return self.core.write_delayed(queue, body, delay_ms / 1000, task_key=task_key)
        return self.core.write(queue, body, task_key=task_key)

    # -- reservations ---------------------------------------------------------------------
    def reserve(
        self, sources: Sequence[tuple[str, str | None]], limit: int
    ) -> tuple[list[Taken], float | None]:
        """Reserve up to ``limit`` messages of ``sources`` (storage queue, dead-letter queue).

        One round trip, in the sources' order. Returns the messages with
        their tokens, and the seconds until the namespace's next delayed
        message is due (None: none is delayed).
        """
        most = self.settings.max_deliveries
        try:
            reserved = self.leases.reserve_queues(
                sources, limit, self.settings.timing.lease_seconds, max_deliveries=most
            )
        except ReplicationTimeout as exc:
            self._hand_back_unconfirmed(exc.result)
            raise
        return self._hold(reserved), reserved.next_due_seconds

    def _hold(self, reserved: MultiLease) -> list[Taken]:
        for lease in reserved.leases:
            if lease.messages:
                self.holdings.hold(lease.token, len(lease.messages))
        return [(lease.token, message) for lease in reserved.leases for message in lease.messages]

    def _hand_back_unconfirmed(self, reserved: object) -> None:
        """Hand back a reservation no replica confirmed (a failover could undo it), uncounted."""
        if isinstance(reserved, MultiLease):
            for lease in reserved.leases:
                if lease.messages:
                    self.release(lease.token, None, undeliver=True)

    # -- settling -------------------------------------------------------------------------
    def ack(self, token: str, message_id: int) -> bool:
        """Delete one reserved message; False when this process no longer held it."""
        self.holdings.let_go(token)
        try:
            settled = self.leases.ack(token, [message_id], delete=True).settled
        except ReplicationTimeout as exc:
            logger.warning(
                "message %d acknowledged, not confirmed by a replica: %s", message_id, exc
            )
            return True
        except BaseException:
            self.holdings.hold(token, 1)  # the caller retries: keep it renewed meanwhile
            raise
        return settled == 1

    def ack_with_result(
        self,
        token: str,
        message_id: int,
        message_key: str,
        value: str,
        ttl_ms: int,
        task_id: str = "",
    ) -> room.Stored:
        """Store a result and delete its message in one step (fenced: see ``dramatiq_store``).

        ``task_id``: the Dramatiq message ID the result is also found by ('' none).
        """
        self.holdings.let_go(token)
        call = room.dramatiq_store(
            self.runner.keys,
            message_key,
            value,
            ttl_ms,
            token=token,
            message_id=message_id,
            task_id=task_id,
        )
        try:
            return self.runner.run(call)
        except ReplicationTimeout as exc:
            logger.warning("result of %d stored, not confirmed by a replica: %s", message_id, exc)
            return room.Stored(True, 1, 0)
        except BaseException:
            self.holdings.hold(token, 1)
            raise

    def still_held(self, token: str) -> bool:
        """Return False when ``token``'s lease is gone (it must not start: another worker may).

        Known at once from the holdings (the heartbeat drops a token whose
        renewal found it gone); when the last renewal is older than the lease
        less a heartbeat interval (the process was paused, or the server was
        unreachable), one renewal of the token asks the server. A server
        that cannot be asked gives True: at-least-once, not at-most-once.
        """
        if not self.holdings.holds(token):
            return False
        timing = self.settings.timing
        if time.monotonic() - self.beat_at < timing.lease_seconds - timing.heartbeat_seconds:
            return True
        try:
            gone = self.leases.renew([token], timing.lease_seconds)
        except Exception:  # noqa: BLE001 - unknown: run it rather than risk not running it
            return True
        if token in gone:
            self.holdings.drop_lost([token])  # taken over: it holds this unstarted message
            return False
        return True

    def store_result(self, message_key: str, value: str, ttl_ms: int, task_id: str = "") -> None:
        """Store a result and wake its waiters (no acknowledgement)."""
        call = room.dramatiq_store(self.runner.keys, message_key, value, ttl_ms, task_id=task_id)
        self.runner.run(call)

    def dead_letter(self, token: str, message_id: int, dead_letter: str) -> bool:
        """Move one reserved message to ``dead_letter``; False when no longer held here."""
        self.holdings.let_go(token)
        call = room.dramatiq_dead(
            self.runner.keys,
            self.dead_message_ttl,
            token=token,
            message_id=message_id,
            dead_letter=dead_letter,
        )
        try:
            return self.runner.run(call).settled == 1
        except ReplicationTimeout as exc:
            logger.warning("message %d dead-lettered, not confirmed: %s", message_id, exc)
            return True
        except BaseException:
            self.holdings.hold(token, 1)
            raise

    def release(self, token: str, ids: Iterable[int] | None, *, undeliver: bool) -> int:
        """Make reserved messages pending again at once (all of ``token`` when None)."""
        id_list = None if ids is None else list(ids)
        if id_list is None:
            self.holdings.drop([token])
        else:
            self.holdings.let_go(token, len(id_list))
        try:
            return int(self.leases.release(token, id_list, undeliver=undeliver))
        except ReplicationTimeout as exc:
            logger.warning("messages handed back, not confirmed by a replica: %s", exc)
            return 0

    def release_groups(self, groups: Mapping[str, list[int]], *, undeliver: bool) -> None:
        """Release each token's IDs (one round trip per token)."""
        for token, ids in groups.items():
            self.release(token, ids, undeliver=undeliver)

    # -- whole queues ---------------------------------------------------------------------
    def count(self, queues: Sequence[str]) -> int:
        """Return the messages of ``queues`` not yet acknowledged: pending, delayed, reserved."""
        total = 0
        for queue in queues:
            for found in self.runner.run(stats(queue)):
                total += int(found.pending)
        return total

    def flush(self, queues: Sequence[str]) -> None:
        """Delete every message of ``queues`` that no worker holds (pending and delayed)."""
        try:
            self.core.delete_from_queues(list(queues))
            return
        except ReservationConflict:
            pass  # a worker holds some: delete what it does not (delayed ones stay)
        leases = self.leases
        for queue in queues:
            while True:
                lease = leases.reserve(queue, FLUSH_BATCH, FLUSH_LEASE)
                if not lease.messages:
                    break
                leases.ack(lease.token, None, delete=True)
        logger.info("flushed %s except the messages workers hold", ", ".join(queues))
