"""What the transport does on the server: publish, reserve, claim, settle, purge; the heartbeat.

A message a channel hands to Celery is *reserved* (``Leases.reserve``): it
stays in its queue (``broker peek`` shows it) but no other worker can take
it until this process acknowledges it (deleted), rejects it (pending again,
or moved to the dead-letter queue) or hands it back (``basic_recover``,
channel close), or until its lease expires because the process died. The
store's heartbeat renews the leases of everything the process holds:
messages reserved ahead of delivery, prefetched and running tasks, and
ETA/countdown tasks the worker keeps until they are due. There is no
visibility timeout. Each state change is one of the backend's scripts
(``docs/architecture.md``).

Priorities (``priorities``, ``priority_order``): a message of priority *P*
> 0 is stored in the SimpleBroker queue ``<queue>.p<P>``, priority 0 (or
none) in the queue itself (:mod:`simplebroker_redis.priorities`); one
reservation reads them in :meth:`Store.levels` order.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from queue import Empty
from typing import Any, Final, cast

from simplebroker.ext import OperationalError

from simplebroker_redis import Leases, RedisBrokerCore, RedisRunner, ReplicationTimeout, calls
from simplebroker_redis.heartbeat import Holdings, LeaseHeartbeat, Standing
from simplebroker_redis.tasks import INDEX_ENV, enabled, index_key, task_stats
from simplebroker_redis.types import LeasedMessage, MultiLease
from simplebroker_redis.validation import validate_message

from . import acks as acks_module
from .acks import Reservation, ResultAcks
from .envelope import Buffered, Unreadable, claimed_tag, delivery_tag, expired, open_body
from .errors import unreachable
from .fencing import HOLDER_FIELD, holder_mark
from .options import TransportOptions, storage_queue
from .outage import Outage
from .prestart import stamp
from .settlements import Settler, deferred_for
from .staging import stage_for
from .taskformat import FRAMEWORK

logger = logging.getLogger("celery_simplebroker")

#: Messages one purge round trip removes.
PURGE_BATCH: Final[int] = 1000

#: Lease of the reservations a purge (or a claim from priority queues) deletes at once.
PURGE_LEASE: Final[float] = 60.0


class Store:
    """One transport's storage operations, its holdings and their heartbeat."""

    def __init__(
        self,
        runner: RedisRunner,
        options: TransportOptions,
        *,
        on_beat: Callable[[], None],
    ) -> None:
        self.runner = runner
        self.options = options
        self.holdings = Holdings()
        self.acks = ResultAcks(runner.identity, self.holdings)
        self.mark = holder_mark(runner.identity)
        self.max_message_size = runner.max_message_size  # BROKER_MAX_MESSAGE_SIZE, as everywhere
        self._on_beat = on_beat
        self.deferred = deferred_for(runner.identity)
        self.outage = Outage(runner.where)
        self.settler = Settler(
            lambda: self.leases, self.holdings, self.acks, self.outage, self.deferred
        )
        self._levels: dict[str, tuple[str, ...]] = {}
        self._heartbeat: LeaseHeartbeat | None = None
        #: Published tasks carry their task index key (:mod:`simplebroker_redis.tasks`).
        self.task_index = enabled(options.task_index, INDEX_ENV)
        #: This process's task statistics (None: off).
        self.task_stats = task_stats(runner) if enabled(options.task_stats) else None

    @functools.cached_property
    def core(self) -> RedisBrokerCore:
        """Return the SimpleBroker connection used for writes, broadcasts and claims."""
        return RedisBrokerCore(self.runner)

    @functools.cached_property
    def publisher(self) -> RedisBrokerCore:
        """Return the SimpleBroker connection publishes use (on :attr:`publishing`)."""
        return RedisBrokerCore(self.publishing)

    @functools.cached_property
    def publishing(self) -> RedisRunner:
        """Return the runner of publishes, declarations: own pool, ``publish_timeout``."""
        return self.runner.sibling(self.options.publish_timeout)

    @functools.cached_property
    def leases(self) -> Leases:
        """Return the reservation API (validates the namespace on first use)."""
        return Leases(self.runner)

    # -- the heartbeat ----------------------------------------------------------------------
    @property
    def heartbeat(self) -> LeaseHeartbeat | None:
        """Return the running heartbeat (renewals and recovery passes), if any."""
        return self._heartbeat

    def start_heartbeat(self) -> None:
        """Renew what this process holds, and recover expired leases, from now on."""
        if self._heartbeat is None:
            timing, beat = self.options.timing, self._beat  # own_renewal: issue 42
            self._heartbeat = LeaseHeartbeat(
                self.runner,
                self.holdings,
                timing,
                framework="celery",
                on_beat=beat,
                own_renewal=True,
            )
        self._heartbeat.start()

    def pause_heartbeat(self) -> None:
        """Stop the heartbeat while nothing is held (nothing consumed either: the caller's check).

        A process that consumed once (``celery inspect`` collecting replies
        on a pooled connection) must not run recovery passes forever.
        """
        if self._heartbeat is not None and not self.holdings.tokens() and not self.deferred:
            self._heartbeat.stop()

    def _beat(self) -> None:
        """After each renewal (heartbeat thread): end an outage, send deferred settlements.

        A beat makes no round trip when nothing is held, so an outage ends
        only after a PING got through.
        """
        if self.outage.down:
            try:
                self.runner.execute(lambda client: client.ping(), idempotent=True)
            except OperationalError as exc:
                if not unreachable(exc):
                    raise
                return  # the heartbeat beats again soon
        self.deferred.retry()
        self.outage.end()
        self._on_beat()

    def close(self) -> None:
        """Stop the heartbeat, send the task statistics; the result backend lets go of it."""
        if self.task_stats is not None:
            self.task_stats.flush_soon(1.0)  # at most 1 s, then in the background
        acks_module.release(self.acks)
        heartbeat, self._heartbeat = self._heartbeat, None
        if heartbeat is not None:
            heartbeat.stop()
        self.publishing.close()  # no-op if nothing was published

    # -- priorities ----------------------------------------------------------------------------
    def levels(self, queue: str) -> tuple[str, ...]:
        """Return the storage queues of ``queue`` in read order (``TransportOptions.levels``)."""
        found = self._levels.get(queue)
        if found is None:
            found = self._levels[queue] = self.options.levels(queue)
        return found

    def level_of(self, queue: str, priority: int) -> str:
        """Return the storage queue of ``queue``'s messages of ``priority``."""
        return self.options.level_of(queue, priority)

    # -- publishing -----------------------------------------------------------------------------
    def write(
        self,
        queue: str,
        envelope: str,
        task: tuple[str, str, int] | None = None,
        *,
        dedupe_key: str | None = None,
    ) -> None:
        """Write a message to ``queue`` (storage name), or stage it during a chord's dispatch.

        ``task`` is the (id, name, retries) of the Celery task it carries: the
        message is indexed under its id and counted per name (unless the
        transport options turn them off). ``dedupe_key``: the publish's
        idempotency key (see :mod:`.publishing`).
        """
        stage = stage_for(self.runner.identity)
        if stage is None:
            key = index_key(FRAMEWORK, task[0]) if task and self.task_index else ""
            self.publisher.write(queue, envelope, task_key=key, dedupe_key=dedupe_key)
        else:
            validate_message(envelope, self.max_message_size)
            stage.messages.append((queue, envelope))
        if task is not None and self.task_stats is not None:
            if task[2] > 0:
                self.task_stats.retried(task[1])
            else:
                self.task_stats.enqueued(task[1])

    def broadcast(self, envelope: str, queues: list[str]) -> None:
        """Write one copy of a message to each of ``queues`` (storage names), atomically."""
        self.publisher.broadcast(envelope, queue_names=queues, create_missing=True)

    # -- taking messages ----------------------------------------------------------------------
    def reservation(self, queue: str, limit: int) -> Reservation:
        """Return the reservation of ``queue`` (storage name), every priority in read order."""
        options = self.options
        dead_letter = options.dead_letter_queue
        sources = self.levels(queue)
        if dead_letter in sources:
            dead_letter = None
        return Reservation(
            sources=[(source, dead_letter) for source in sources],
            limit=limit,
            lease_seconds=options.lease_seconds,
            max_deliveries=options.max_deliveries if dead_letter else None,
            holder=self.holdings.holder,
        )

    def reserve(self, queue: str, limit: int) -> list[Buffered]:
        """Reserve up to ``limit`` messages of ``queue`` (storage name), in read order.

        One round trip (``reserve_queues`` over :meth:`levels`); returns
        (token, message) pairs in delivery order.
        """
        plan = self.reservation(queue, limit)
        sent = time.monotonic()
        try:
            with self._polling():
                reserved = self.leases.reserve_queues(
                    plan.sources,
                    plan.limit,
                    plan.lease_seconds,
                    max_deliveries=plan.max_deliveries,
                    holder=plan.holder,
                )
        except ReplicationTimeout as exc:
            self.hand_back_unconfirmed(exc.result)
            raise
        return self.hold(reserved, sent)

    def hold(self, reserved: MultiLease, sent: float | None = None) -> list[Buffered]:
        """Renew what a reservation took from now on; return its (token, message) pairs.

        ``sent``: ``time.monotonic()`` before the reservation's request was
        sent (the server's clock is learned from its reply), if known.
        """
        if sent is not None and reserved.messages:
            self.holdings.clock.observe(reserved.created_ns, sent)
        for lease in reserved.leases:
            if lease.messages:
                self.holdings.hold(lease.token, len(lease.messages), lease.deadline_ns)
        if reserved.messages:
            self.start_heartbeat()
            acks_module.hold(self.acks)
        return [(lease.token, message) for lease in reserved.leases for message in lease.messages]

    def hand_back_unconfirmed(self, reserved: object) -> None:
        """Hand back a reservation that raised ``ReplicationTimeout``, its delivery not counted.

        A failover could lose it: stranding its messages until their lease ran
        out would count deliveries (dead-lettering some that never ran).
        """
        if isinstance(reserved, MultiLease):
            groups = {lease.token: lease.ids for lease in reserved.leases if lease.messages}
            self.release(groups, undeliver=True)

    def deliverable(
        self, queue: str, token: str, message: LeasedMessage, ttl: float | None
    ) -> dict[str, Any] | None:
        """Return the kombu payload of a reserved message of Celery queue ``queue``.

        None when it expired (acknowledged, so deleted) or is not a kombu
        message (moved to the dead-letter queue, or ``<queue>.unreadable``).
        """
        if not self._startable(token, message.id):
            return None
        tag = delivery_tag(token, message.id)
        try:
            payload = open_body(message.body, message.id, tag=tag, deliveries=message.deliveries)
            payload["properties"][HOLDER_FIELD] = self.mark  # its result is fenced by its lease
            stamp(payload["properties"], self.holdings.local_deadline(token))
        except Unreadable:
            logger.error("message %d of queue %s is not a kombu message", message.id, queue)
            self.dead_letter(token, message.id, unreadable=queue)
            return None
        if expired(payload, message.id, ttl):
            self.ack(token, message.id)
            return None
        return payload

    def taken_over(self, stale: Mapping[str, Standing]) -> set[str]:
        """Return the tokens of delivered tasks that another worker holds now.

        ``stale``: tokens the event loop found ``EXPIRED`` or ``LOST``. ``LOST``
        ones are; ``EXPIRED`` ones (past their known deadline) are renewed at
        once, one round trip, and those the server no longer knows are too,
        unless settled here meanwhile (``Holdings.drop_lost``). During an
        outage nothing is asked: a later check finds what the heartbeat lost.
        """
        lost = {token for token, standing in stale.items() if standing is Standing.LOST}
        expired = [token for token, standing in stale.items() if standing is Standing.EXPIRED]
        if expired and not self.outage.down:
            lost |= self._renew_now(expired)
        return lost

    def _renew_now(self, tokens: list[str]) -> set[str]:
        """Renew ``tokens`` at once, as the heartbeat does; return those found lost."""
        lease = self.options.lease_seconds
        holdings = self.holdings
        sent = time.monotonic()
        try:
            renewal = self.leases.renewal(tokens, lease)
        except OperationalError as exc:
            if not unreachable(exc):
                raise
            self.outage.begin(exc)
            return set()
        holdings.clock.observe(renewal.now_ns, sent)
        kept = (token for token in tokens if token not in renewal.lost)
        holdings.renewed(kept, renewal.now_ns + round(lease * 1e9))
        holdings.drop_lost(renewal.lost)
        # Lost whether this renewal or the heartbeat's found it so; not one
        # whose last messages another thread settled meanwhile (the server
        # dropped the token because the settlement landed).
        return {token for token in tokens if holdings.standing(token) is Standing.LOST}

    def _startable(self, token: str, message_id: int) -> bool:
        """Return True when a buffered message's lease still holds: it may be delivered.

        One past its known deadline is handed back, its delivery not counted
        (it never ran); one lost or let go of is not started either.
        """
        standing = self.holdings.standing(token)
        if standing is Standing.HELD:
            return True
        if standing is Standing.EXPIRED:
            logger.warning(
                "message %d is not started: its lease ran out while it waited here; "
                "it is handed back",
                message_id,
            )
            self.release({token: [message_id]}, undeliver=True)
        elif standing is Standing.LOST:
            logger.warning(
                "message %d is not started: its lease was lost (another worker has it)", message_id
            )
        else:
            logger.info("message %d is not started: this worker let go of it", message_id)
        return False

    def claim(self, queue: str, ttl: float | None) -> dict[str, Any] | None:
        """Consume one message of a ``no_ack`` queue (None: expired); raise Empty when none.

        Without priorities one ``claim`` script; with them, a reservation
        over the priority queues and its deletion (two round trips for a
        message, one for an empty queue).
        """
        with self._polling():
            return self._claim(queue, ttl)

    def _claim(self, queue: str, ttl: float | None) -> dict[str, Any] | None:
        storage = storage_queue(queue)
        deliveries = 0  # a claim script does not count deliveries
        if not self.options.priorities:
            row = self.core.claim_one(storage, with_timestamps=True)
            if row is None:
                raise Empty()
            body, message_id = cast("tuple[str, int]", row)  # with_timestamps: (body, id)
        else:
            reserved = self.leases.reserve_queues(
                [(source, None) for source in self.levels(storage)], 1, PURGE_LEASE
            )
            if not reserved.leases:
                raise Empty()
            lease = reserved.leases[0]
            message = lease.messages[0]
            body, message_id, deliveries = message.body, message.id, message.deliveries
            self.leases.ack(lease.token, None, delete=True)
        message_id, tag = int(message_id), claimed_tag(int(message_id))
        try:
            payload = open_body(body, message_id, tag=tag, deliveries=deliveries)
        except Unreadable:
            logger.error("message %s of %s is not a kombu message; dropped", message_id, queue)
            return None
        return None if expired(payload, message_id, ttl) else payload

    def ready(self, queue: str) -> int:
        """Return ``queue``'s ready messages (kombu's declaration before a publish asks).

        Tried once: a read the runner would repeat after a timeout would let
        one declaration wait ``publish_timeout`` twice (issue 42: a second
        ``delay()`` in the same blackhole took 11 s).
        """
        count = calls.ready_count(self.runner.keys, self.levels(queue))
        return self.publishing.run(dataclasses.replace(count, idempotent=False))

    def purge(self, queue: str) -> int:
        """Delete the queue's messages that nobody holds (storage name, every priority)."""
        leases, removed = self.leases, 0
        for source in self.levels(queue):
            while True:
                lease = leases.reserve(source, PURGE_BATCH, PURGE_LEASE)
                if not lease.messages:
                    break
                removed += leases.ack(lease.token, None, delete=True).settled
        return removed

    # -- settling (see .settlements) ---------------------------------------------------------
    def ack(self, token: str, message_id: int) -> None:
        """Delete one reserved message (one round trip; none when its result did it)."""
        self.settler.ack(token, message_id)

    def release(self, groups: Mapping[str, Iterable[int]], *, undeliver: bool) -> None:
        """Make reserved messages pending again at once, atomically per reservation."""
        self.settler.release(groups, undeliver=undeliver)

    def dead_letter(self, token: str, message_id: int, *, unreadable: str | None = None) -> None:
        """Move a rejected message to the dead-letter queue, or delete it when there is none."""
        target = self.options.dead_letter_queue
        if target is None and unreadable is not None:
            target = storage_queue(f"{unreadable}.unreadable")
        if target is None:
            self.ack(token, message_id)
        else:
            self.settler.dead_letter(token, message_id, target)

    @contextlib.contextmanager
    def _polling(self) -> Iterator[None]:
        """Deliver nothing during an outage: ``Empty`` instead of a round trip or its failure."""
        if self.outage.down:
            raise Empty()
        try:
            yield
        except OperationalError as exc:
            if not unreachable(exc):
                raise
            self.outage.begin(exc)
            raise Empty() from None
