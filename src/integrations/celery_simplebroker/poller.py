"""When the transport polls its queues: drains, the event loop's tick and alarm, wake-ups.

kombu's virtual transport polls every queue each ``polling_interval``; this
one does not. Once a poll finds nothing to deliver, the :class:`Poller`
waits until a queue's Pub/Sub wake-up (every write, release and recovery
publishes one), a nudge from an acknowledgement or a prefetch change
(``basic_qos``), or at most ``idle_recheck`` seconds, and polls again only
then; a queue a poll found empty is skipped until its wake-up (see
:mod:`.wakeups`).

In a worker's event loop (Celery's hub, every pool but gevent and
eventlet) the wait is the loop's own poll, on a descriptor the wake-ups make
readable (:meth:`Poller.register`), and each turn of the loop delivers
what the prefetch window has room for. Elsewhere (green pools, ``celery
inspect``, any ``drain_events`` caller) it is a sleep in :meth:`Poller.drain`.

Busy queues are not listened to: after :data:`MUTE_AFTER` reservations in
a row that filled their batch, a queue's wake-ups are dropped until a
reservation finds fewer messages than it asked for.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from queue import Empty
from typing import Any, Final, Protocol

from celery import signals

from simplebroker_redis.holdings import Standing
from simplebroker_redis.types import MultiLease

from .acks import Ahead, Reservation
from .envelope import Buffered, Tag, reserved_by_token
from .errors import LeasesRanOut
from .options import TransportOptions, storage_queue
from .store import Store
from .wakeups import Stopping, Wakeups

#: Reservations of a queue in a row that filled their batch, after which the
#: poller stops listening to the queue's wake-ups: the queue has a backlog,
#: and every write on it would wake this process for nothing (a Pub/Sub
#: message read per task). The first reservation that finds fewer messages
#: than it asked for listens again, before the next poll.
MUTE_AFTER: Final[int] = 16

#: Seconds a drain sleeps, delivering nothing, once the worker is shutting down.
STOPPING_NAP: Final[float] = 0.1

#: Seconds between two checks of the delivered tasks' leases in the event loop.
LEASE_CHECK: Final[float] = 0.25

#: Messages one turn of the event loop delivers at most, before it polls its
#: other descriptors (the pool's pipes, timers) again.
TICK_DELIVERIES: Final[int] = 64


class Consumer(Protocol):
    """What the poller reads of a channel (the transport's channels are these)."""

    closed: bool

    def consuming(self) -> bool:
        """Return True when the channel has a consumer."""

    def consumed_queues(self) -> dict[str, bool]:
        """Return the Celery queues consumed -> True when consumed with acknowledgements."""

    def buffered(self) -> int:
        """Return how many messages the channel reserved but has not delivered."""

    def can_take_more(self) -> bool:
        """Return True when the prefetch window has room."""

    def stale_delivered(self) -> dict[str, Standing]:
        """Return the tokens of delivered, unacknowledged messages whose lease may have run out."""

    def room_ahead(self, acked: Tag) -> int:
        """Return the window's room once the acknowledgements queued (``acked``'s too) are sent."""

    def took(self, queue: str, reserved: list[Buffered], limit: int, generation: int) -> None:
        """Buffer a reservation of ``queue`` that asked for ``limit``, begun at ``generation``."""


#: Every poller of this process (a forked child's are its parent's; see pid).
_ALL: weakref.WeakSet[Poller] = weakref.WeakSet()


def _stop_waiting(**kwargs: Any) -> None:
    """Stop the pollers' sleeps when the worker begins a shutdown (in its signal handler).

    A worker without an event loop (gevent, eventlet) drains with a 2 s
    timeout, sees the shutdown only between two drains, and drains once
    more on its way out: a SIGTERM waited up to 4 s for sleeps. The
    sleeping drain returns at once, later ones after at most
    :data:`STOPPING_NAP`, all with nothing. In an event loop the alarm
    ends the loop's poll, and the loop delivers nothing more.
    """
    pid = os.getpid()
    pollers: tuple[Poller, ...] = ()
    for _ in range(3):  # another thread may add a poller meanwhile (no lock here)
        try:
            pollers = tuple(_ALL)
            break
        except RuntimeError:
            continue
    for poller in pollers:
        if poller.pid == pid:
            poller.wakeups.stop_waiting()


signals.worker_shutting_down.connect(_stop_waiting, weak=False)


class Poller:
    """Decides when one transport polls, and sleeps (or lets the event loop sleep) between.

    Args:
        store: The transport's store (read order of the queues, reservations).
        options: The transport's options.
        channels: Returns the transport's open channels.
        poll: Delivers one message of some consumed queue (kombu's
            ``cycle.get``); raises ``queue.Empty`` when none was delivered.

    """

    def __init__(
        self,
        store: Store,
        options: TransportOptions,
        *,
        channels: Callable[[], Iterable[Consumer]],
        poll: Callable[[float | None], None],
    ) -> None:
        self.store = store
        self.options = options
        self.wakeups = Wakeups(store.runner)
        self.pid = os.getpid()
        self._channels = channels
        self._poll = poll
        self._must_poll = True
        self._next_recheck = 0.0
        self._full_batches: dict[str, int] = {}  # storage queue -> full reservations in a row
        self._muted: set[str] = set()  # storage queues whose wake-ups are not listened to
        # The pid whose subscriptions match the consumers and mutes; None once they changed.
        self._watched_for: int | None = None
        self._loop: Any = None  # the event loop delivering this transport's messages
        self._loop_thread: int | None = None
        self._recheck_timer: Any = None
        self._alarm = -1  # the wake-ups' alarm descriptor, while in a loop
        self._closed = False
        self._next_lease_check = 0.0
        store.outage.on_end = self._outage_ended
        _ALL.add(self)

    def close(self) -> None:
        """Deliver nothing more: leave the event loop (the transport closes)."""
        self._closed = True
        self.leave()

    def unsubscribe(self) -> None:
        """Drop the wake-up subscriptions and the alarm (once the channels are closed)."""
        self.wakeups.close()

    # -- what is consumed ------------------------------------------------------------------
    def consumed_queues(self) -> set[str]:
        """Return the Celery queues the transport's open channels consume."""
        # A snapshot: the heartbeat thread calls this while the consumer thread changes them.
        return {queue for channel in list(self._channels()) for queue in channel.consumed_queues()}

    def nudge(self) -> None:
        """Tell a waiting drain that room or consumers changed (any thread)."""
        self.wakeups.nudge()

    def _outage_ended(self) -> None:
        """Poll every queue again at once: the server answers again (the heartbeat thread)."""
        self._must_poll = True
        self.wakeups.forget_empty()
        self.wakeups.nudge()

    def consumers_changed(self, *, consuming: bool) -> None:
        """Poll again on the next drain; the heartbeat runs while consuming or holding."""
        self._must_poll = True
        self._watched_for = None
        if consuming:
            self.store.start_heartbeat()
            return
        self.wakeups.keep(self._watched())
        if not self.consumed_queues():
            self.store.pause_heartbeat()

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

    # -- draining --------------------------------------------------------------------------------
    def drain(self, timeout: float | None) -> None:
        """Deliver one message, waiting on wake-ups rather than polling; TimeoutError if none."""
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
                    self._poll(timeout)
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
    def register(self, loop: Any) -> None:
        """Deliver from ``loop`` (Celery's hub), in the reader of the wake-ups' alarm.

        Before each poll the loop's tick rings the alarm when there is
        something to deliver; a wake-up or an acknowledgement from another
        thread rings it too. A timer makes the loop turn at least every
        ``idle_recheck`` seconds, for the recheck.
        """
        self.leave()
        self._alarm = self.wakeups.alarm()
        self._loop_thread = threading.get_ident()
        loop.add_reader(self._alarm, self._on_alarm)
        loop.on_tick.add(self._on_tick)
        self._recheck_timer = loop.call_repeatedly(self.options.idle_recheck, self._recheck)
        self._loop = loop

    def leave(self) -> None:
        """Stop delivering from the event loop (the transport closes, or joins another loop)."""
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
        self._check_leases()
        self._take_signals()
        # No _watch() here: consumer and mute changes set _must_poll, and the
        # alarm's reader subscribes before it polls.
        if self._should_poll():
            self._must_poll = True
            self.wakeups.ring()

    def _check_leases(self) -> None:
        """Restart Celery's consumer when tasks it holds were taken over (see :mod:`.fencing`).

        Every :data:`LEASE_CHECK` s, before the loop polls (so before the
        prefork pool is handed another task); see ``Store.taken_over``.
        """
        now = time.monotonic()
        if now < self._next_lease_check:
            return
        self._next_lease_check = now + LEASE_CHECK
        stale = {t: s for c in list(self._channels()) for t, s in c.stale_delivered().items()}
        lost = self.store.taken_over(stale) if stale else set()
        if lost:
            raise LeasesRanOut(len(lost))

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
                self._poll(0)
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
        return self._must_poll or any(channel.buffered() for channel in self._channels())

    def _prefetch_full(self) -> bool:
        consuming = [channel for channel in self._channels() if channel.consuming()]
        return bool(consuming) and not any(channel.can_take_more() for channel in consuming)

    def _watched(self) -> dict[str, str]:
        """Return every storage queue of the consumed queues -> the queue it counts for."""
        return {
            level: storage
            for storage in (storage_queue(queue) for queue in self.consumed_queues())
            if storage not in self._muted
            for level in self.store.levels(storage)
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

    # -- reservations made by a result's script (acks.Prefetcher) ----------------------------
    def ahead(self, acked: Tag) -> Ahead | None:
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
            for channel in self._channels()
            for queue, acknowledged in channel.consumed_queues().items()
            if acknowledged
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
        plan = self.store.reservation(storage, room)
        generation = self.wakeups.generation(storage)
        deliver = functools.partial(self._took_ahead, channel, queue, plan, generation)
        return Ahead(plan, deliver)

    def _took_ahead(
        self,
        channel: Consumer,
        queue: str,
        plan: Reservation,
        generation: int,
        reserved: MultiLease,
    ) -> None:
        """Buffer what a result's script reserved (:meth:`ahead`) for the loop to deliver."""
        pairs = self.store.hold(reserved)
        if channel.closed or queue not in channel.consumed_queues():
            # The consumer is gone meanwhile: hand them back, never delivered.
            self.store.release(reserved_by_token(pairs), undeliver=True)
            return
        channel.took(queue, pairs, plan.limit, generation)
        if pairs:
            self._must_poll = True

    def hand_back_unconfirmed(self, reserved: object) -> None:
        """Hand back a reservation no replica confirmed (see ``Store.hand_back_unconfirmed``)."""
        self.store.hand_back_unconfirmed(reserved)
