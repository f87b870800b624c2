"""The kombu transport: one runner, the heartbeat, Pub/Sub wake-ups, and the storage calls.

Select it with ``broker_url = "simplebroker+redis://host:6379/0"`` after
``import celery_simplebroker`` (which registers the ``simplebroker`` alias),
or with ``broker_transport = "celery_simplebroker.transport:Transport"`` and
``broker_url = "redis://host:6379/0"``. See ``docs/celery.md``.

kombu's virtual transport polls every queue each ``polling_interval``; this
one does not. Once a poll finds nothing to deliver, the transport waits
until a queue's Pub/Sub wake-up (every write, release and recovery
publishes one), a nudge from an acknowledgement or a prefetch change
(``basic_qos``), or at most ``idle_recheck`` seconds, and polls again only
then; a queue a poll found empty is skipped until its wake-up (see
:mod:`.wakeups`).

The transport is asynchronous: a worker (other than a gevent or eventlet
one) runs it in its event loop, Celery's hub (:meth:`Transport.register_with_event_loop`),
which it needs for its prefork pool's asynchronous form. There the wait is
the hub's own poll, on a descriptor the wake-ups make readable, and each
turn of the loop delivers what the prefetch window has room for. Elsewhere
(green pools, ``celery inspect``, any ``drain_events`` caller) the wait is
a sleep in :meth:`Transport.drain_events`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from queue import Empty
from typing import Any, Final, cast

import redis
from celery import signals
from kombu.transport import virtual
from simplebroker import resolve_config
from simplebroker.ext import OperationalError

from simplebroker_redis import (
    LeasedMessage,
    Leases,
    RedisBrokerCore,
    ReplicationTimeout,
    Settlement,
)
from simplebroker_redis.calls import MultiLease
from simplebroker_redis.heartbeat import Holdings, LeaseHeartbeat
from simplebroker_redis.priorities import levels
from simplebroker_redis.validation import validate_message

from .bindings import Binding, Bindings
from .channel import (
    EXPIRES_FIELD,
    PURGE_BATCH,
    PURGE_LEASE,
    Channel,
    delivery_tag,
    reserved_by_token,
)
from .cycle import ControlFirstCycle
from .options import (
    TRANSPORT_OPTIONS,
    TransportOptions,
    make_runner,
    resolve_target,
    shown_url,
    storage_queue,
    warn_unknown_options,
)
from .staging import stage_for
from .wakeups import Stopping, Wakeups

logger = logging.getLogger("celery_simplebroker")

#: Lifetime (seconds) of the bindings of an ``auto_delete`` queue without ``x-expires``.
AUTO_DELETE_LIFETIME: Final[float] = 30.0

#: Reservations of a queue in a row that filled their batch, after which the
#: transport stops listening to the queue's wake-ups: the queue has a backlog,
#: and every write on it would wake this process for nothing (a Pub/Sub
#: message read per task). The first reservation that finds fewer messages
#: than it asked for listens again, before the next poll.
MUTE_AFTER: Final[int] = 16

#: This process's transports that reserved messages and are not closed (consumers):
#: the result backend finds a task's holder among them.
_TRANSPORTS: set[Transport] = set()


#: Seconds a drain sleeps, delivering nothing, once the worker is shutting down.
STOPPING_NAP: Final[float] = 0.1

#: Messages one turn of the event loop delivers at most, before it polls its
#: other descriptors (the pool's pipes, timers) again.
TICK_DELIVERIES: Final[int] = 64

#: Every transport of this process (a forked child's are its parent's; see pid).
_ALL: weakref.WeakSet[Transport] = weakref.WeakSet()


def _stop_waiting(**kwargs: Any) -> None:
    """Stop the transports' sleeps when the worker begins a shutdown (in its signal handler).

    A worker without an event loop (gevent, eventlet) drains with a 2 s
    timeout, sees the shutdown only between two drains, and drains once
    more on its way out: a SIGTERM waited up to 4 s for sleeps. The
    sleeping drain returns at once, later ones after at most
    :data:`STOPPING_NAP`, all with nothing. In an event loop the alarm
    ends the loop's poll, and the loop delivers nothing more.
    """
    pid = os.getpid()
    transports: tuple[Transport, ...] = ()
    for _ in range(3):  # another thread may add a transport meanwhile (no lock here)
        try:
            transports = tuple(_ALL)
            break
        except RuntimeError:
            continue
    for transport in transports:
        if transport.pid == pid:
            transport.wakeups.stop_waiting()


signals.worker_shutting_down.connect(_stop_waiting, weak=False)


def holder_of(token: str, identity: object) -> Transport | None:
    """Return this process's transport holding reservation ``token`` on target ``identity``.

    None when no transport of this process (a forked pool child inherits its
    parent's, which it does not hold) holds it on that server and namespace.
    """
    pid = os.getpid()
    for transport in tuple(_TRANSPORTS):
        if (
            transport.pid == pid
            and transport.runner.identity == identity
            and transport.holdings.holds(token)
        ):
            return transport
    return None


class Transport(virtual.Transport):
    """kombu transport on simplebroker-redis: leases, heartbeat, Pub/Sub wake-ups."""

    Channel = Channel
    Cycle = ControlFirstCycle  # remote control before tasks (see .cycle)
    driver_type = "redis"
    driver_name = "simplebroker-redis"
    #: The URL (``redis://``, ``rediss://``, ``unix://``) is the runner's target, unparsed.
    can_parse_url = True
    # kombu annotates the base's value as a one-element tuple.
    connection_errors = (  # type: ignore[assignment]
        *virtual.Transport.connection_errors,
        OperationalError,
        redis.ConnectionError,
        redis.TimeoutError,
    )
    implements = virtual.Transport.implements.extend(
        asynchronous=True,
        exchange_type=frozenset(["direct", "topic", "fanout"]),
    )

    def __init__(self, client: Any, **kwargs: Any) -> None:
        super().__init__(client, **kwargs)
        raw_options: Mapping[str, Any] = client.transport_options or {}
        self.options = TransportOptions.parse(raw_options)
        warn_unknown_options("broker_transport_options", raw_options, TRANSPORT_OPTIONS)
        self.runner = make_runner(resolve_target(client.hostname), raw_options)
        self.bindings = Bindings(self.runner)
        self.max_message_size = int(resolve_config()["MAX_MESSAGE_SIZE"])
        self.holdings = Holdings()
        self._core: RedisBrokerCore | None = None
        self._leases: Leases | None = None
        self._queue_ttls: dict[str, float] = {}
        self._levels: dict[str, tuple[str, ...]] = {}
        self._queue_lifetimes: dict[str, float] = {}
        self._expiring: dict[str, Binding] = {}
        self.wakeups = Wakeups(self.runner)
        self._must_poll = True
        self._next_recheck = 0.0
        self._full_batches: dict[str, int] = {}  # storage queue -> full reservations in a row
        self._muted: set[str] = set()  # storage queues whose wake-ups are not listened to
        # The pid whose subscriptions match the consumers and mutes; None once they changed.
        self._watched_for: int | None = None
        self._heartbeat: LeaseHeartbeat | None = None
        self.pid = os.getpid()
        _ALL.add(self)
        # Messages acknowledged together with their task's result (see
        # ack_with_result): True once the server confirmed it, False before.
        self._with_result: dict[tuple[str, int], bool] = {}
        self._with_result_lock = threading.Lock()
        self._loop: Any = None  # the event loop delivering this transport's messages
        self._loop_thread: int | None = None
        self._recheck_timer: Any = None
        self._alarm = -1  # the wake-ups' alarm descriptor, while in a loop
        self._closed = False

    # -- connection lifecycle --------------------------------------------------------
    def as_uri(self, uri: str, include_password: bool = False, mask: str = "**") -> str:
        """Return the broker URL for Celery's banner and logs (any target form, password hidden)."""
        return shown_url(uri, include_password)

    def establish_connection(self) -> Any:
        """Reach the server and create or validate the namespace (kombu retries failures)."""
        self.runner.ensure_initialized()
        return super().establish_connection()

    def close_connection(self, connection: Any) -> None:
        """Close channels (handing held messages back), the heartbeat, and the pool."""
        _TRANSPORTS.discard(self)
        self._closed = True
        self._leave_loop()
        try:
            super().close_connection(connection)
        finally:
            if self._heartbeat is not None:
                self._heartbeat.stop()
                self._heartbeat = None
            self.wakeups.close()
            self.runner.close()

    @property
    def core(self) -> RedisBrokerCore:
        """Return the SimpleBroker connection used for writes, broadcasts and stats."""
        if self._core is None:
            self._core = RedisBrokerCore(self.runner)
        return self._core

    @property
    def leases(self) -> Leases:
        """Return the reservation API."""
        if self._leases is None:
            self._leases = Leases(self.runner)
        return self._leases

    def _ensure_heartbeat(self) -> None:
        if self._heartbeat is None:
            options = self.options
            self._heartbeat = LeaseHeartbeat(
                self.runner,
                self.holdings,
                lease_seconds=options.lease_seconds,
                interval=options.heartbeat_interval,
                recover_interval=options.recover_interval,
                on_lost=_lost,
                on_beat=self._refresh_bindings,
                logger=logger,
                name="celery-simplebroker-heartbeat",
            )
        self._heartbeat.start()

    # -- queues and bindings -------------------------------------------------------------
    def remember_queue(self, queue: str, declaration: Mapping[str, Any]) -> None:
        """Record a declared queue's message TTL and unused lifetime."""
        arguments = declaration.get("arguments") or {}
        ttl = arguments.get("x-message-ttl")
        if ttl:
            self._queue_ttls[queue] = float(ttl) / 1000
        expires = arguments.get("x-expires")
        if expires:
            self._queue_lifetimes[queue] = float(expires) / 1000
        elif declaration.get("auto_delete"):
            self._queue_lifetimes[queue] = AUTO_DELETE_LIFETIME

    def queue_lifetime(self, queue: str) -> float:
        """Return how long the queue's bindings live unrefreshed (0: forever)."""
        return self._queue_lifetimes.get(queue, 0.0)

    def bind(self, binding: Binding) -> None:
        """Record a binding; an expiring one is refreshed while this process consumes it."""
        self.bindings.bind([binding])
        if binding.lifetime:
            self._expiring[binding.name] = binding

    def table(self, exchange: str) -> list[Binding]:
        """Return the live bindings of ``exchange``; delete the queues of expired ones."""
        live, removed = self.bindings.table(exchange)
        for binding in removed:
            try:
                self.purge(storage_queue(binding.queue))
            except Exception as exc:  # noqa: BLE001 - a later lookup need not fail for it
                logger.debug("purging expired queue %s failed: %s", binding.queue, exc)
        return live

    def consumed_queues(self) -> set[str]:
        """Return the Celery queues this transport's open channels consume."""
        # Snapshots: the heartbeat thread calls this while the consumer thread changes them.
        return {queue for channel in list(self.channels) for queue in list(channel._active_queues)}

    def _refresh_bindings(self) -> None:
        consumed = self.consumed_queues()
        alive = [b for b in list(self._expiring.values()) if b.queue in consumed]
        if alive:
            self.bindings.bind(alive)

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

    # -- publishing -----------------------------------------------------------------------------
    def write(self, queue: str, envelope: str) -> None:
        """Write a message to ``queue`` (storage name), or stage it during a chord's dispatch."""
        stage = stage_for(self.runner.identity)
        if stage is None:
            self.core.write(queue, envelope)
            return
        validate_message(envelope, self.max_message_size)
        stage.messages.append((queue, envelope))

    # -- taking messages ----------------------------------------------------------------------
    def levels(self, queue: str) -> tuple[str, ...]:
        """Return the storage queues of ``queue`` (storage name) in read order.

        With priorities (the default) ``queue.p9`` ... ``queue.p1``, then
        ``queue`` (:mod:`simplebroker_redis.priorities`); else ``queue`` alone.
        """
        found = self._levels.get(queue)
        if found is None:
            found = self._levels[queue] = levels(queue) if self.options.priorities else (queue,)
        return found

    def reserve(self, queue: str, limit: int) -> list[tuple[str, LeasedMessage]]:
        """Reserve up to ``limit`` messages of ``queue`` (storage name), highest priority first.

        One round trip (``reserve_queues`` over :meth:`levels`); returns
        (token, message) pairs in delivery order.
        """
        plan = self._reservation(queue, limit)
        try:
            reserved = self.leases.reserve_queues(
                plan.sources, plan.limit, plan.lease_seconds, max_deliveries=plan.max_deliveries
            )
        except ReplicationTimeout as exc:
            self.hand_back_unconfirmed(exc.result)
            raise
        return self._hold(reserved)

    def hand_back_unconfirmed(self, reserved: object) -> None:
        """Hand back a reservation that raised ``ReplicationTimeout``, its delivery not counted.

        It happened on the primary, but a failover could still lose it and let
        another worker run its tasks while this one does; stranding them until
        their lease expired would count a delivery each time (and send the
        oldest messages, reserved first, to the dead-letter queue after a few
        failovers without running).
        """
        if isinstance(reserved, MultiLease):
            groups = {lease.token: lease.ids for lease in reserved.leases if lease.messages}
            self.release(groups, undeliver=True)

    def _reservation(self, queue: str, limit: int) -> Reservation:
        """Return the reservation of ``queue`` (storage name), every priority, highest first."""
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
        )

    def _hold(self, reserved: MultiLease) -> list[tuple[str, LeasedMessage]]:
        """Renew what a reservation took from now on; return its (token, message) pairs."""
        for lease in reserved.leases:
            if lease.messages:
                self.holdings.hold(lease.token, len(lease.messages))
        if reserved.messages:
            self._ensure_heartbeat()
            _TRANSPORTS.add(self)
        return [(lease.token, message) for lease in reserved.leases for message in lease.messages]

    def ahead(self, acked: tuple[str, int]) -> Ahead | None:
        """Plan the reservation a result's script can make with its acknowledgement.

        A solo worker runs its tasks in the event loop's thread, one at a
        time; the result of one is stored (and the task acknowledged) before
        the loop delivers the next, and when the prefetch window's messages
        are all delivered, the loop would reserve the next batch in a round
        trip of its own. The result's script reserves it instead (see
        ``celery_store.lua``): only in the loop's thread (no other thread
        touches the channel's buffer), for the one queue consumed with
        acknowledgements, when it is not known empty, as many messages as
        the window will have room for once the loop sends the
        acknowledgements it has queued (``acked`` among them). None when
        any of that does not hold, and while the channel still buffers
        messages: a reservation costs the server a token and an upkeep
        pass however few messages it takes, so the window is refilled
        whole, by the result of the last task buffered (a window of 4:
        with every fourth result), not a few tasks at a time. The loop
        never waits for it: that result is stored before the loop looks
        for the next task.
        """
        if self._loop is None or threading.get_ident() != self._loop_thread:
            return None
        if self.wakeups.stopping or self._closed:
            return None
        targets = [
            (channel, queue)
            for channel in self.channels
            if channel._consumers
            for queue in channel._active_queues
            if queue not in channel._noack
        ]
        if len(targets) != 1:
            return None
        channel, queue = targets[0]
        storage = storage_queue(queue)
        if channel.buffered() or self.wakeups.known_empty(storage):
            return None
        room = channel.room_ahead(acked)
        if room < 1:
            return None
        generation = self.wakeups.generation(storage)
        return Ahead(channel, queue, self._reservation(storage, room), generation)

    def took_ahead(self, ahead: Ahead, reserved: MultiLease) -> None:
        """Buffer what a result's script reserved (:meth:`ahead`) for the loop to deliver."""
        channel, queue = ahead.channel, ahead.queue
        pairs = self._hold(reserved)
        if channel.closed or queue not in channel._active_queues:
            # The consumer is gone meanwhile: hand them back, never delivered.
            self.release(reserved_by_token(pairs), undeliver=True)
            return
        channel.took(queue, pairs, ahead.reservation.limit, ahead.generation)
        if pairs:
            self._must_poll = True

    def reserved_batch(self, queue: str, *, full: bool) -> None:
        """Record whether a reservation of ``queue`` (storage name) filled its batch.

        After :data:`MUTE_AFTER` full ones in a row the queue's wake-ups are
        dropped (:meth:`_watched`); the first one that is not full listens
        again, and the drain polls once more after the subscription is
        confirmed, so a write made meanwhile is not missed.
        """
        if full:
            count = self._full_batches[queue] = self._full_batches.get(queue, 0) + 1
            if count >= MUTE_AFTER and queue not in self._muted:
                self._muted.add(queue)
                self._watched_for = None
            return
        self._full_batches.pop(queue, None)
        if queue in self._muted:
            self._muted.discard(queue)
            self._watched_for = None
            self._must_poll = True

    def open_envelope(
        self, queue: str, token: str, message: LeasedMessage
    ) -> dict[str, Any] | None:
        """Return the kombu payload of a reserved message (None: expired or unreadable)."""
        try:
            payload: dict[str, Any] = json.loads(message.body)
            properties = payload["properties"]
        except (ValueError, KeyError, TypeError):
            logger.error("message %d of queue %s is not a kombu message", message.id, queue)
            self.dead_letter(token, message.id, unreadable=queue)
            return None
        if self._expired(queue, message.id, payload):
            self.ack(token, message.id)
            return None
        redelivered = message.deliveries > 1
        properties["delivery_tag"] = delivery_tag(token, message.id)
        properties.setdefault("delivery_info", {})["redelivered"] = redelivered
        payload["redelivered"] = redelivered
        return payload

    def claim(self, queue: str) -> dict[str, Any] | None:
        """Consume one message of a ``no_ack`` queue (None: expired); raise Empty when none.

        Without priorities one ``claim`` script; with them, a reservation
        over the priority queues and its deletion (two round trips for a
        message, one for an empty queue).
        """
        storage = storage_queue(queue)
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
            body, message_id = lease.messages[0].body, lease.messages[0].id
            self.leases.ack(lease.token, None, delete=True)
        try:
            payload: dict[str, Any] = json.loads(body)
            payload["properties"]["delivery_tag"] = f"claimed:{message_id}"
        except (ValueError, KeyError, TypeError):
            logger.error("message %s of %s is not a kombu message; dropped", message_id, queue)
            return None
        return None if self._expired(queue, int(message_id), payload) else payload

    def _expired(self, queue: str, message_id: int, payload: dict[str, Any]) -> bool:
        now = time.time()
        expires_at = payload.get(EXPIRES_FIELD)
        if expires_at is not None and now > float(expires_at):
            return True
        ttl = self._queue_ttls.get(queue)
        # A message ID is its writer's wall clock in nanoseconds (SimpleBroker's hybrid IDs).
        return ttl is not None and now > message_id / 1e9 + ttl

    # -- settling ----------------------------------------------------------------------------
    def ack(self, token: str, message_id: int) -> None:
        """Delete one reserved message (one round trip; none when its result did it).

        The heartbeat stops renewing it first: once the server settled a
        token's last message the token is gone, and a renewal racing with
        this call must not find it still held and report it lost.
        """
        with self._with_result_lock:
            confirmed = self._with_result.pop((token, message_id), None)
        if confirmed:
            return
        if confirmed is None:
            self.holdings.settle(token)
        try:
            settlement = self.leases.ack(token, [message_id], delete=True)
        except ReplicationTimeout as exc:
            # Celery would log a failed acknowledgement as critical; it happened.
            logger.warning("message %d acknowledged, not confirmed: %s", message_id, exc)
            settlement = exc.result
        self._report(settlement, message_id)

    @staticmethod
    def _report(settlement: Settlement, message_id: int) -> None:
        if settlement.lost:
            logger.warning(
                "message %d was acknowledged after its lease expired; it may have run twice",
                message_id,
            )

    def ack_with_result(self, token: str, message_id: int) -> bool:
        """Start acknowledging a held message in the script that stores its task's result.

        Returns False when this transport does not hold it. Otherwise the
        heartbeat stops renewing it (as for :meth:`ack`) and the caller
        reports the script's outcome to :meth:`acked_with_result`; Celery's
        own acknowledgement then costs nothing, or, when the script did not
        confirm it, is sent as usual.
        """
        key = (token, message_id)
        with self._with_result_lock:
            if key in self._with_result:
                return not self._with_result[key]  # a retried store carries it again
            if not self.holdings.holds(token):
                return False
            self._with_result[key] = False
        self.holdings.settle(token)
        return True

    def acked_with_result(self, token: str, message_id: int, settlement: Settlement) -> None:
        """Record that the result's script deleted the message (``settlement`` from it)."""
        with self._with_result_lock:
            if (token, message_id) in self._with_result:
                self._with_result[(token, message_id)] = True
        self._report(settlement, message_id)

    def settled_with_result(self, message: tuple[str, int]) -> bool:
        """Return True when the script storing its task's result deleted ``message``."""
        with self._with_result_lock:
            return self._with_result.get(message, False)

    def _unsettled(self, token: str, ids: Iterable[int]) -> tuple[list[int], int]:
        """Split ``ids`` for a release or reject: (still on the server, already unheld).

        Drops messages whose result's script deleted them already; counts
        those the heartbeat stopped renewing for an unconfirmed one.
        """
        left, unheld = [], 0
        with self._with_result_lock:
            for message_id in ids:
                confirmed = self._with_result.pop((token, message_id), None)
                if confirmed is None:
                    left.append(message_id)
                elif not confirmed:
                    left.append(message_id)
                    unheld += 1
        return left, unheld

    def release(self, groups: Mapping[str, Iterable[int]], *, undeliver: bool) -> None:
        """Make reserved messages pending again, atomically per reservation."""
        for token, ids in groups.items():
            id_list, unheld = self._unsettled(token, ids)
            if not id_list:
                continue
            if len(id_list) > unheld:  # before the server drops the token
                self.holdings.settle(token, len(id_list) - unheld)
            try:
                self.leases.release(token, id_list, undeliver=undeliver)
            except ReplicationTimeout:
                pass  # done on the primary, not confirmed by a replica yet
            except Exception as exc:  # noqa: BLE001 - the lease expires and brings them back
                logger.warning(
                    "could not hand back %d message(s) (%s); they return when their lease expires",
                    len(id_list),
                    exc,
                )

    def dead_letter(self, token: str, message_id: int, *, unreadable: str | None = None) -> None:
        """Move a rejected message to the dead-letter queue, or delete it when there is none."""
        target = self.options.dead_letter_queue
        if target is None and unreadable is not None:
            target = storage_queue(f"{unreadable}.unreadable")
        if target is None:
            self.ack(token, message_id)
            return
        left, unheld = self._unsettled(token, [message_id])
        if not left:
            return  # its result's script deleted it already
        if not unheld:
            self.holdings.settle(token)  # before the server drops the token
        try:
            self.leases.reject(token, [message_id], target)
        except ReplicationTimeout as exc:  # moved on the primary, as for ack
            logger.warning("message %d moved to %s, not confirmed: %s", message_id, target, exc)

    # -- waiting -------------------------------------------------------------------------------
    def nudge(self) -> None:
        """Tell a waiting ``drain_events`` that room or consumers changed (any thread)."""
        self.wakeups.nudge()

    def consumers_changed(self, *, consuming: bool) -> None:
        """Poll again on the next drain; the heartbeat runs while consuming or holding.

        A process that consumed once (``celery inspect`` collecting replies
        on a pooled connection) must not run recovery passes forever.
        """
        self._must_poll = True
        self._watched_for = None
        if consuming:
            self._ensure_heartbeat()
            return
        self.wakeups.keep(self._watched())
        if (
            self._heartbeat is not None
            and not self.holdings.tokens()
            and not self.consumed_queues()
        ):
            self._heartbeat.stop()

    def drain_events(self, connection: Any, timeout: float | None = None, **kwargs: Any) -> None:
        """Deliver one message, waiting on wake-ups rather than polling."""
        if self.wakeups.stopping:
            # The worker is shutting down: deliver nothing more. A short nap, not
            # none: a loop that drains until told to stop (a gevent worker's
            # remote-control greenlet) must not spin without yielding.
            time.sleep(STOPPING_NAP if timeout is None else max(0.0, min(timeout, STOPPING_NAP)))
            raise TimeoutError()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self._watch()  # subscribed before polling: no wake-up is missed
            if self._should_poll():
                self._must_poll = False
                try:
                    cycle: Any = self.cycle
                    cycle.get(self._deliver, timeout=timeout)
                    self._must_poll = True  # only an empty poll means "sleep"
                    return
                except Empty:
                    self._next_recheck = time.monotonic() + self.options.idle_recheck
                    if self._must_poll:
                        continue  # a queue listens again: subscribe, then poll once more
            now = time.monotonic()
            wait = self._next_recheck - now
            if deadline is not None:
                if deadline <= now:
                    raise TimeoutError()
                wait = min(wait, deadline - now)
            try:
                if self.wakeups.wait(max(0.0, wait), wakeups=not self._prefetch_full()):
                    self._must_poll = True
            except Stopping:
                raise TimeoutError() from None  # back to the worker's loop, which stops

    # -- the event loop ------------------------------------------------------------------------
    def register_with_event_loop(self, connection: Any, loop: Any) -> None:
        """Deliver from ``loop`` (Celery's hub), in the reader of the wake-ups' alarm.

        Before each poll the loop's tick rings the alarm when there is
        something to deliver; a wake-up or an acknowledgement from another
        thread rings it too. A timer makes the loop turn at least every
        ``idle_recheck`` seconds, for the recheck.
        """
        self._leave_loop()
        self._alarm = self.wakeups.alarm()
        self._loop_thread = threading.get_ident()
        loop.add_reader(self._alarm, self._on_alarm)
        loop.on_tick.add(self._on_tick)
        self._recheck_timer = loop.call_repeatedly(self.options.idle_recheck, self._recheck)
        self._loop = loop

    def _leave_loop(self) -> None:
        loop, self._loop = self._loop, None
        if loop is None or self.pid != os.getpid():
            # A forked pool process's copy: the loop's epoll set is its parent's too.
            return
        loop.on_tick.discard(self._on_tick)
        if self._recheck_timer is not None:
            self._recheck_timer.cancel()
            self._recheck_timer = None
        with contextlib.suppress(Exception):  # a closed hub has no poller left
            loop.remove_reader(self._alarm)

    def _recheck(self) -> None:
        pass  # the timer only makes the loop turn; _should_poll sees that the recheck is due

    def _on_tick(self) -> None:
        """Before the loop polls: when there is something to deliver, ring the alarm.

        Delivering here would be too early: what a delivery hands the loop
        (Celery schedules a task's acknowledgement with ``call_soon``) would
        wait for the end of the poll. Delivered in :meth:`_on_alarm`, after
        the poll, it runs in the next turn.
        """
        if self._closed or self.wakeups.stopping:
            return
        self._take_signals()
        # No _watch() here: consumer and mute changes set _must_poll, and the
        # alarm's reader subscribes before it polls.
        if self._should_poll():
            self._must_poll = True
            self.wakeups.ring()

    def _take_signals(self) -> None:
        """Poll again after a nudge, or a wake-up when the prefetch window has room."""
        if self.wakeups.take(wakeups=not self._prefetch_full()):
            self._must_poll = True

    def _on_alarm(self) -> None:
        """Deliver what the prefetch window has room for (the alarm rang)."""
        self.wakeups.silence()
        if self._closed or self.wakeups.stopping:
            return
        self._take_signals()  # rung by another thread: no need to wait for the next turn
        for _ in range(TICK_DELIVERIES):
            self._watch()  # subscribed before polling: no wake-up is missed
            if not self._should_poll():
                return
            self._must_poll = False
            try:
                cycle: Any = self.cycle
                cycle.get(self._deliver, timeout=0)
            except Empty:
                self._next_recheck = time.monotonic() + self.options.idle_recheck
                if not self._must_poll:
                    return  # nothing to deliver, or no room: wait for the alarm
                continue  # a queue listens again: subscribe, then poll once more
            self._must_poll = True  # only an empty poll means "wait"
        # More may be waiting: _must_poll stays set, and the next turn rings again.

    def _should_poll(self) -> bool:
        now = time.monotonic()
        if now >= self._next_recheck:
            # Wake-ups are hints: every idle_recheck, busy or not, ask the server again.
            self.wakeups.forget_empty()
            self._next_recheck = now + self.options.idle_recheck
            return True
        return self._must_poll or any(channel.buffered() for channel in self.channels)

    def _prefetch_full(self) -> bool:
        consuming = [channel for channel in self.channels if channel._consumers]
        return bool(consuming) and not any(channel.qos.can_consume() for channel in consuming)

    def _watched(self) -> dict[str, str]:
        """Return every storage queue of the consumed queues -> the queue it counts for."""
        return {
            level: storage
            for storage in (storage_queue(queue) for queue in self.consumed_queues())
            if storage not in self._muted
            for level in self.levels(storage)
        }

    def _watch(self) -> None:
        """Subscribe to the consumed queues' wake-ups, when consumers or mutes changed.

        Called before every poll; builds the watched set only after a change
        (or in a forked process, whose wake-ups start afresh).
        """
        pid = os.getpid()
        if self._watched_for == pid:
            return
        self._watched_for = pid  # before building: a change meanwhile marks it again
        try:
            changed = self.wakeups.watch(self._watched())
        except BaseException:
            self._watched_for = None  # the next poll tries again
            raise
        if changed:
            self._must_poll = True


@dataclass(frozen=True, slots=True)
class Reservation:
    """What a reservation of one queue asks for (``reserve_queues`` and ``celery_store``)."""

    sources: list[tuple[str, str | None]]  #: (storage queue, dead-letter queue) in read order
    limit: int
    lease_seconds: float
    max_deliveries: int | None


@dataclass(frozen=True, slots=True)
class Ahead:
    """A reservation a result's script makes for a channel (see :meth:`Transport.ahead`)."""

    channel: Channel
    queue: str  #: the Celery queue it is for
    reservation: Reservation
    generation: int  #: the queue's wake-up count before the script ran


def _lost(tokens: set[str]) -> None:
    # Called from the heartbeat thread.
    logger.warning(
        "%d reservation(s) expired before renewal; their messages may run again", len(tokens)
    )
