"""The wake-up listener: one Pub/Sub connection per process and namespace.

One :class:`WakeupListener` per (process, target, namespace) (see
:mod:`.registry`) holds a dedicated Pub/Sub connection (never one from the
command pool) to the namespace's primary and a daemon thread that
dispatches messages to every registered waiter. On connection loss it
reconnects as :class:`~.outage.Outage` says, subscribes again, and wakes
every waiter once so a wake-up lost during the outage cannot stall anyone.
When the slot moves to another cluster node the server ends the
subscription with an unrequested ``sunsubscribe`` (or a subscription is
answered with MOVED): the listener treats both as an outage and reconnects
to the new owner. With no waiter left it closes its connection and ends its
thread after :data:`IDLE_LINGER` seconds.
"""

from __future__ import annotations

import os
import select
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, Final, NoReturn

import redis

from ..runner import RedisRunner
from .memo import Mark, QuietMemo
from .outage import PING_INTERVAL, PING_TIMEOUT, SUBSCRIBE_WAIT, Outage, SlotMoved, Unanswered

#: Seconds :meth:`WakeupListener.sync` waits for its PING to be answered.
SYNC_WAIT: Final[float] = 1.0

#: Seconds a listener with no subscribed queue keeps its connection and
#: thread; then it closes both, and the next waiter opens them again. A
#: process that watched many namespaces, or servers that are gone, holds
#: no connection or reconnect loop for them.
IDLE_LINGER: Final[float] = 30.0

#: What a waiter registers: called from the listener thread on a wake-up.
Callback = Callable[[], None]

#: What ends a subscription: the connection broke, or a reply was garbled.
_BROKEN = (redis.RedisError, OSError, ValueError)


class _Retired(Exception):
    """The listener thread ends: no queue has been subscribed for IDLE_LINGER seconds."""


class WakeupListener:
    """A process-local Pub/Sub connection shared by every waiter of a namespace."""

    def __init__(self, runner: RedisRunner) -> None:
        self._runner = runner
        self._lock = threading.RLock()
        # Signalled when the server confirms a (un)subscription.
        self._confirm = threading.Condition(self._lock)
        self._confirmed: set[str] = set()
        # SUNSUBSCRIBEs sent on the current connection and not yet answered,
        # per channel: their answer is not the server ending a subscription,
        # even when the channel was subscribed again meanwhile.
        self._leaving: dict[str, int] = {}
        self._callbacks: dict[str, set[Callback]] = {}
        self._pubsub: Any = None
        self._client: Any = None
        self._thread: threading.Thread | None = None
        self._wake_r, self._wake_w = os.pipe()
        # Always subscribed to one control channel, so the connection stays in
        # subscribed mode (liveness PINGs are answered as pub/sub messages).
        self._control = runner.keys.wake_prefix + "~listener"
        self.reconnects = 0  #: completed reconnects (observability, tests)
        self.retirements = 0  #: times the thread ended for lack of subscribers
        self._retire_soon = False  # close_idle_listeners(): retire without lingering
        self._memo = QuietMemo()  # under self._lock, like everything above
        self._pings = 0  # PINGs sent on the subscription (each answered in order)
        self._pongs = 0  # their answers read

    # -- registration (any thread) --------------------------------------------
    def register(self, channels: Iterable[str], callback: Callback) -> None:
        """Deliver wake-ups on ``channels`` to ``callback`` (from the listener thread)."""
        with self._lock:
            self._retire_soon = False
            fresh = []
            for channel in channels:
                owners = self._callbacks.setdefault(channel, set())
                if not owners:
                    fresh.append(channel)
                owners.add(callback)
            self._ensure_thread()
            if fresh and self._pubsub is not None:
                try:
                    self._pubsub.ssubscribe(*fresh)
                except (redis.RedisError, OSError):
                    self._poke()  # the listener thread reconnects and resubscribes
            # Return only once the server confirmed every channel, so a write
            # made right after the waiter exists cannot be missed. An
            # unreachable server only delays this (SUBSCRIBE_WAIT at most).
            wanted = set(channels)
            self._confirm.wait_for(lambda: wanted <= self._confirmed, SUBSCRIBE_WAIT)

    # -- quiet queues (any thread) ------------------------------------------------
    def quiet_mark(self, channel: str) -> Mark | None:
        """Return a mark that changes whenever ``channel`` may have had a wake-up.

        None unless the channel is subscribed right now (confirmed by the
        server on the current connection); see :mod:`.memo`.
        """
        with self._lock:
            if self._pubsub is None or channel not in self._confirmed:
                return None
            return self._memo.mark(channel)

    def sync(self, timeout: float = SYNC_WAIT) -> bool:
        """Return True once every wake-up published before this call has been read.

        One PING on the subscribed connection: the server answers it after
        delivering every message published before it, in order. False when
        the subscription is down or the answer takes longer than ``timeout``.
        """
        with self._lock:
            if self._pubsub is None:
                return False
            try:
                self._pubsub.ping()
            except (redis.RedisError, OSError):
                self._poke()  # the listener thread reconnects
                return False
            self._pings += 1
            wanted = self._pings
            return self._confirm.wait_for(lambda: self._pongs >= wanted, timeout)

    def quiet_since(self, channel: str, after: int | None) -> Mark | None:
        """Return the mark taken before a probe found ``channel``'s queue empty, if any."""
        with self._lock:
            return self._memo.quiet_since(channel, after)

    def remember(self, channel: str, after: int | None, mark: Mark | None) -> None:
        """Record that a probe begun at ``mark`` found the queue empty (None: forget)."""
        with self._lock:
            self._memo.remember(channel, after, mark)

    def unregister(self, channel: str, callback: Callback) -> None:
        """Stop delivering ``channel`` to ``callback``; raises if UNSUBSCRIBE fails."""
        with self._lock:
            owners = self._callbacks.get(channel)
            if owners is None or callback not in owners:
                return
            owners.discard(callback)
            if owners:
                return
            del self._callbacks[channel]
            if self._pubsub is not None:
                self._pubsub.sunsubscribe(channel)
                self._leaving[channel] = self._leaving.get(channel, 0) + 1

    # -- the listener thread ----------------------------------------------------
    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(
                target=self._run,
                name=f"simplebroker-redis-listener:{self._runner.where}",
                daemon=True,
            )
            self._thread.start()

    def _retire_if_idle(self, idle_since: float | None) -> float | None:
        """Track how long no queue is subscribed; end this thread after IDLE_LINGER.

        Returns the new ``idle_since``; raises :class:`_Retired` (with the
        connection closed and the thread slot released, under the lock, so
        a concurrent ``register()`` starts a fresh thread) once idle long enough.
        """
        with self._lock:
            if self._callbacks:
                return None
            now = time.monotonic()
            if not self._retire_soon:
                if idle_since is None:
                    return now
                if now - idle_since < IDLE_LINGER:
                    return idle_since
            self._retire_soon = False
            self._disconnect()
            self._thread = None
            self.retirements += 1
        raise _Retired

    def retire_if_idle(self) -> threading.Thread | None:
        """Have the thread close its connection now if no queue is subscribed.

        Returns the thread to join, or None when there is nothing to close
        (no thread, or a waiter still subscribed).
        """
        with self._lock:
            thread = self._thread
            if self._callbacks or thread is None or not thread.is_alive():
                return None
            self._retire_soon = True
        self._poke()
        return thread

    def _poke(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass

    def _connect(self) -> None:
        client = self._runner.connections.subscriber()
        # Called through Any: redis-py 7 leaves pubsub() unannotated, 8 annotates it.
        make_pubsub: Any = client.pubsub
        pubsub: Any = make_pubsub()
        with self._lock:
            self._confirmed.clear()
            self._leaving.clear()
            self._memo.new_epoch()
            self._pings = self._pongs = 0  # a new connection answers its own PINGs
            pubsub.ssubscribe(self._control, *self._callbacks)
            self._pubsub = pubsub
            self._client = client  # owns the pool; dropping it closes the socket

    def _disconnect(self) -> None:
        with self._lock:
            self._memo.new_epoch()
            # Nothing is subscribed without a connection. A channel left here
            # (its sunsubscribe reply unread when the thread retired) would let
            # the next register() return before the new connection subscribed
            # it, and a write made right then would wake nobody.
            self._confirmed.clear()
            pubsub, self._pubsub = self._pubsub, None
            client, self._client = self._client, None
        for resource in (pubsub, client):
            if resource is not None:
                try:
                    resource.close()
                except Exception:  # noqa: BLE001 - the connection is already broken
                    pass

    def _wake_all(self) -> None:
        with self._lock:
            callbacks = {cb for owners in self._callbacks.values() for cb in owners}
        for callback in callbacks:
            callback()

    def _dispatch(self, channel: str) -> None:
        with self._lock:
            callbacks = list(self._callbacks.get(channel, ()))
        for callback in callbacks:
            callback()

    def _drain(self, readable: bool = False) -> None:
        """Handle every message the connection holds, without waiting for more.

        ``readable``: poll() just reported the socket readable, so the first
        read returns at once (a closed socket raises, and the thread
        reconnects). Reads replies straight off the connection and lets
        redis-py's PubSub parse and track them: its ``get_message`` polls the
        socket three times per message and wraps each read in its retry
        machinery, which the listener does not use (it reconnects itself).
        """
        while True:
            with self._lock:
                pubsub = self._pubsub
                connection = pubsub.connection if pubsub is not None else None
                if connection is None:
                    return
                if not readable and not connection.can_read(timeout=0):
                    return
                readable = False
                woken = self._handle(pubsub.handle_message(connection.read_response()))
            if woken is not None:
                self._dispatch(woken)

    def _handle(self, message: dict[str, Any] | None) -> str | None:
        """Account for one Pub/Sub message (under the lock); return a woken channel."""
        if message is None:
            return None
        kind = message.get("type")
        if kind == "pong":
            self._pongs += 1
            self._confirm.notify_all()
            return None
        channel = str(message["channel"])
        if kind == "ssubscribe":
            self._confirmed.add(channel)
            self._confirm.notify_all()
        elif kind == "sunsubscribe":
            self._confirmed.discard(channel)
            asked = self._leaving.get(channel, 0)
            if asked > 1:
                self._leaving[channel] = asked - 1
            elif asked == 1:
                del self._leaving[channel]
            elif channel == self._control or channel in self._callbacks:
                raise SlotMoved(channel)
        elif kind == "smessage":
            self._memo.heard(channel)
            return channel
        return None

    def _run(self) -> None:
        try:
            self._reconnect_loop()
        except _Retired:
            return

    def _reconnect_loop(self) -> None:
        outage = Outage(self._runner.connections, self._runner.where)
        first = True
        idle_since: float | None = None
        while True:
            try:
                self._connect()
                self._drain()  # an SSUBSCRIBE answered with MOVED raises here
            except _BROKEN as exc:
                delay = outage.lost(exc, None)
                self._disconnect()
                idle_since = self._retire_if_idle(idle_since)
                time.sleep(delay)
                continue
            outage.subscribed()
            if not first:
                self.reconnects += 1
                self._wake_all()
            first = False
            started = time.monotonic()
            try:
                self._serve()  # ends only by raising
            except _BROKEN as exc:
                delay = outage.lost(exc, time.monotonic() - started)
            self._disconnect()
            time.sleep(delay)

    def _serve(self) -> NoReturn:
        # Liveness: a PING after PING_INTERVAL s without a byte from the
        # server, answered within PING_TIMEOUT s (any byte counts), or the
        # connection is given up as half-open.
        heard = time.monotonic()
        pinged: float | None = None
        idle_since: float | None = None
        # The socket watched and its wait (built once per socket).
        watch: tuple[Any, Callable[[float], set[int]]] | None = None
        while True:
            idle_since = self._retire_if_idle(idle_since)
            sock = self._pubsub.connection._sock if self._pubsub.connection else None
            if sock is None:
                raise redis.ConnectionError("pub/sub connection closed")
            if watch is None or watch[0] is not sock:
                watch = (sock, _readiness(sock.fileno(), self._wake_r))
            ready = watch[1](1.0)
            poked = self._wake_r in ready
            if poked:
                os.read(self._wake_r, 4096)
            readable = sock.fileno() in ready
            if poked or readable:
                self._drain(readable=readable)
            now = time.monotonic()
            if readable:
                heard, pinged = now, None
            elif pinged is not None:
                if now - pinged > PING_TIMEOUT:
                    raise Unanswered
            elif now - heard > PING_INTERVAL:
                with self._lock:
                    self._pubsub.ping()
                    self._pings += 1
                pinged = now


def _readiness(*fds: int) -> Callable[[float], set[int]]:
    """Return a function that waits up to ``timeout`` s for ``fds`` to be readable.

    It returns the readable (or closed) descriptors. poll, not select:
    select fails for descriptors >= 1024, which a busy process (many pools
    and listeners) reaches. eventlet's monkey-patching (``celery worker -P
    eventlet``) removes ``select.poll``; its green ``select`` waits on the
    hub's epoll, without that limit.
    """
    if hasattr(select, "poll"):
        poller = select.poll()
        for fd in fds:
            poller.register(fd, select.POLLIN)
        return lambda timeout: {fd for fd, _ in poller.poll(timeout * 1000)}
    watched = list(fds)
    return lambda timeout: set(select.select(watched, [], [], timeout)[0])
