"""Wake-ups of the queues a transport consumes: which are known empty, and sleeping.

Every script that makes a message pending publishes on its queue's wake
channel, so a queue that a poll found empty stays empty until its channel
says otherwise. :class:`Wakeups` subscribes to each consumed queue's channel
(through the process's one Pub/Sub listener, before the first poll), and:

- remembers the queues a poll found empty, so ``drain_events`` does not
  spend a round trip on them (Celery's pidbox queue, polled in turn with
  the task queue, was one wasted round trip per task). A per-queue
  generation, read before the poll's round trip, keeps a wake-up that
  arrives during it from being overwritten by "empty";
- lets the consumer sleep until a wake-up, a nudge (an acknowledgement made
  room in the prefetch window, consumers changed) or a timeout, with no
  polling slices; or, in an event loop (Celery's hub), makes a descriptor
  readable (:meth:`Wakeups.alarm`) so the loop's poll ends instead.

Wake-ups are hints: the transport forgets every "empty" mark at each idle
recheck, and the listener wakes every queue after it reconnects.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable, Iterable, Mapping
from contextlib import suppress

from simplebroker_redis import RedisRunner
from simplebroker_redis.activity import listener_for

logger = logging.getLogger("celery_simplebroker")


class Stopping(Exception):  # noqa: N818 - an event, not an error
    """A sleep refused or ended by :meth:`Wakeups.stop_waiting`."""


class Wakeups:
    """Per-queue wake-up subscriptions of one transport, and its sleep."""

    def __init__(self, runner: RedisRunner) -> None:
        self._runner = runner
        self._cond = threading.Condition()
        self._woken = False
        self._nudged = False
        self._stopping = False
        self._generation: dict[str, int] = {}
        self._empty: set[str] = set()
        self._callbacks: dict[str, Callable[[], None]] = {}  # by watched queue
        self._keys: dict[str, str] = {}  # watched queue -> the queue it counts for
        self._counted: frozenset[str] = frozenset()  # the values of _keys
        self._pid = os.getpid()
        self._alarm: tuple[socket.socket, socket.socket] | None = None  # (reader, writer)
        self._alarm_pending = False
        self._loop_thread: int | None = None

    # -- subscriptions (the consumer thread) -------------------------------------------------
    def watch(self, queues: Mapping[str, str]) -> bool:
        """Subscribe to exactly ``queues``; return True when that changed.

        ``queues`` maps each storage queue to watch to the queue whose
        wake-ups and "empty" mark it counts for (a priority queue counts
        for its base queue: the consumer polls them together). Returns once
        the server confirmed the new subscriptions, so a message written
        after this call is never missed.
        """
        if self._pid != os.getpid():  # a forked child: the parent's listener is not ours
            self._pid = os.getpid()
            self._callbacks.clear()
            self._keys.clear()
            self._counted = frozenset()
        wanted = dict(queues)
        if wanted == self._keys:
            return False
        listener = listener_for(self._runner)
        for queue in [queue for queue, key in self._keys.items() if wanted.get(queue) != key]:
            self._unregister(queue)
        for queue in sorted(set(wanted) - set(self._callbacks)):
            key = self._keys[queue] = wanted[queue]
            callback = self._callbacks[queue] = self._callback(key)
            listener.register([self._runner.keys.wake_channel(queue)], callback)
        self._counted = frozenset(self._keys.values())
        return True

    def keep(self, queues: Iterable[str]) -> None:
        """Drop the subscriptions of queues not in ``queues`` (consumers cancelled).

        Without it a connection that stopped consuming (``celery inspect``'s
        reply queue, on a pooled connection) would keep its subscriptions,
        and the process its wake-up connection, until the connection closes.
        """
        if self._pid != os.getpid():
            return  # a forked child: watch() starts afresh
        wanted = set(queues)
        for queue in set(self._callbacks) - wanted:
            self._unregister(queue)

    def close(self) -> None:
        """Drop every subscription (best effort: the listener outlives failures), and the alarm."""
        for queue in list(self._callbacks):
            self._unregister(queue)
        with self._cond:
            alarm, self._alarm = self._alarm, None
        if alarm is not None:
            for end in alarm:
                end.close()

    def _unregister(self, queue: str) -> None:
        callback = self._callbacks.pop(queue)
        key = self._keys.pop(queue, queue)
        self._counted = frozenset(self._keys.values())
        with self._cond:
            self._empty.discard(key)
        try:
            listener_for(self._runner).unregister(self._runner.keys.wake_channel(queue), callback)
        except Exception as exc:  # noqa: BLE001 - the listener resubscribes on its own
            logger.debug("unsubscribing the wake-ups of %s failed: %s", queue, exc)

    def _callback(self, queue: str) -> Callable[[], None]:
        def woken() -> None:  # the listener thread
            with self._cond:
                self._generation[queue] = self._generation.get(queue, 0) + 1
                self._empty.discard(queue)
                self._woken = True
                self._cond.notify_all()
                self._ring()

        return woken

    # -- what polls found ---------------------------------------------------------------------
    def generation(self, queue: str) -> int:
        """Return ``queue``'s wake-up count; read it before a poll's round trip."""
        with self._cond:
            return self._generation.get(queue, 0)

    def found_empty(self, queue: str, generation: int) -> None:
        """Record that a poll begun at ``generation`` found ``queue`` empty."""
        with self._cond:
            if queue in self._counted and self._generation.get(queue, 0) == generation:
                self._empty.add(queue)

    def known_empty(self, queue: str) -> bool:
        """Return True when ``queue`` was found empty and no wake-up came since."""
        with self._cond:
            return queue in self._empty

    def forget_empty(self) -> None:
        """Poll every queue again (the idle recheck: wake-ups are hints)."""
        with self._cond:
            self._empty.clear()

    # -- sleeping -----------------------------------------------------------------------------
    def nudge(self) -> None:
        """End a sleep: room in the prefetch window, or consumers changed (any thread)."""
        with self._cond:
            self._nudged = True
            self._cond.notify_all()
            self._ring()

    @property
    def stopping(self) -> bool:
        """Return True once :meth:`stop_waiting` was called."""
        return self._stopping

    def stop_waiting(self) -> None:
        """End the current sleep and every later one at once: the worker is shutting down.

        Safe in a signal handler that interrupts the sleeping thread itself
        (the condition's lock is reentrant and released while it sleeps).
        """
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            self._ring(always=True)  # the loop's poll ends, and the loop sees the shutdown

    def wait(self, seconds: float, *, wakeups: bool) -> bool:
        """Sleep until nudged, woken (when ``wakeups``), or ``seconds``; True unless timed out.

        With ``wakeups`` False (the prefetch window is full) a wake-up does
        not end the sleep, but is kept for the next one.

        Raises:
            Stopping: :meth:`stop_waiting` was called (now or before).

        """
        with self._cond:

            def ready() -> bool:
                return self._stopping or self._nudged or (wakeups and self._woken)

            happened = self._cond.wait_for(ready, seconds)
            if self._stopping:
                raise Stopping
            self._nudged = False
            if wakeups:
                self._woken = False
            return happened

    def take(self, *, wakeups: bool) -> bool:
        """Return what :meth:`wait` would, without sleeping: True when nudged or woken since.

        The event loop's form of :meth:`wait` (see :meth:`alarm`); with
        ``wakeups`` False a wake-up is kept for a later call.
        """
        with self._cond:
            happened = self._nudged or (wakeups and self._woken)
            self._nudged = False
            if wakeups:
                self._woken = False
            return happened

    # -- an event loop's alarm ----------------------------------------------------------------
    def alarm(self) -> int:
        """Return a descriptor that becomes readable whenever a :meth:`wait` would end.

        For an event loop (Celery's hub), which calls this from its own
        thread: it polls the descriptor with its others instead of sleeping
        here, calls :meth:`silence` when it is readable, and :meth:`take`
        before delivering. A wake-up, a nudge from another thread, or
        :meth:`stop_waiting` sends one byte, and no more until silenced;
        a nudge from the loop's own thread sends none (the loop checks
        :meth:`take` before it polls again).
        """
        with self._cond:
            if self._alarm is None:
                reader, writer = socket.socketpair()
                reader.setblocking(False)
                writer.setblocking(False)
                self._alarm, self._alarm_pending = (reader, writer), False
            self._loop_thread = threading.get_ident()
            return self._alarm[0].fileno()

    def silence(self) -> None:
        """Read the alarm's bytes; the next wake-up or nudge sends one again."""
        with self._cond:
            if self._alarm is None:
                return
            with suppress(OSError):  # drained before the flag clears: no byte is left unread
                self._alarm[0].recv(4096)
            self._alarm_pending = False

    def ring(self) -> None:
        """Make the alarm readable (the loop has more to deliver: its poll must not sleep)."""
        with self._cond:
            self._ring(always=True)

    def _ring(self, *, always: bool = False) -> None:
        # Called with self._cond held.
        if self._alarm is None or self._alarm_pending:
            return
        if not always and threading.get_ident() == self._loop_thread:
            return
        self._alarm_pending = True
        with suppress(OSError):  # full (a byte is waiting) or closed: nothing to add
            self._alarm[1].send(b"\0")
