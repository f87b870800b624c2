"""Activity waiters: Pub/Sub wake-ups when a queue gets pending work.

Every script that makes messages pending publishes ``1`` on the queue's wake
channel inside the same script, so a wake-up costs no extra round trip and
never announces work that did not commit. Wake-ups are hints: owners still
drain queues through ordinary operations.

Wake-ups use sharded Pub/Sub (``SPUBLISH``/``SSUBSCRIBE``, Redis and Valkey
7+) on every topology: the channels carry the namespace's hash tag, so in a
cluster they live on the node that owns the namespace's slot and a wake-up is
not broadcast to every node; a single server or a Sentinel primary serves
them the same way, so there is one code path.

One :class:`WakeupListener` per (process, target, namespace) holds a dedicated
Pub/Sub connection (never one from the command pool) to the namespace's
primary and a daemon thread that dispatches messages to every registered
waiter. On connection loss it reconnects with exponential backoff, subscribes
again, and wakes every waiter once so a wake-up lost during the outage cannot
stall anyone; it logs one warning per outage. When the slot moves to another
cluster node the server ends the subscription with an unrequested
``sunsubscribe`` (or a subscription is answered with MOVED): the listener
treats both as an outage and reconnects to the new owner. A forked child
gets its own listener the first time it uses a waiter.
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final

import redis
import redis.exceptions as rx

from .retry import Backoff
from .runner import RedisRunner
from .validation import validate_queue_name

#: Seconds between liveness PINGs on an idle Pub/Sub connection.
PING_INTERVAL: Final[float] = 30.0

#: Seconds a new registration waits for the listener's first connection.
CONNECT_WAIT: Final[float] = 5.0

#: Seconds :meth:`WakeupListener.sync` waits for its PING to be answered.
SYNC_WAIT: Final[float] = 1.0

#: Longest slice a waiter sleeps before re-checking its stop event.
STOP_POLL: Final[float] = 0.05

#: Seconds a subscription must last to end an outage. A failover can let a
#: reconnect succeed to the demoted node, which then drops it again: that is
#: the same outage (one warning), and the next reconnect backs off.
STABLE_AFTER: Final[float] = 2.0

#: Seconds a listener with no subscribed queue keeps its connection and
#: thread; then it closes both, and the next waiter opens them again. A
#: process that watched many namespaces, or servers that are gone, holds
#: no connection or reconnect loop for them.
IDLE_LINGER: Final[float] = 30.0

Callback = Callable[[], None]

logger = logging.getLogger("simplebroker_redis")


class SlotMoved(redis.ConnectionError):
    """The server ended a subscription we still want: the namespace's slot moved."""


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
        self._stopping = False
        # Always subscribed to one control channel, so the connection stays in
        # subscribed mode (liveness PINGs are answered as pub/sub messages).
        self._control = runner.keys.wake_prefix + "~listener"
        self.reconnects = 0  #: completed reconnects (observability, tests)
        self.retirements = 0  #: times the thread ended for lack of subscribers
        self._retire_soon = False  # close_idle_listeners(): retire without lingering
        # Marks that change whenever a channel may have received a wake-up:
        # the connection's epoch (one per connect and disconnect) and a count
        # of the messages read per channel. See quiet_mark().
        self._epoch = 0
        self._heard: dict[str, int] = {}
        self._pings = 0  #: PINGs sent on the subscription (each answered in order)
        self._pongs = 0  #: their answers read
        self._quiet: dict[tuple[str, int | None], tuple[int, int]] = {}

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
            # unreachable server only delays this (CONNECT_WAIT at most).
            wanted = set(channels)
            self._confirm.wait_for(lambda: wanted <= self._confirmed, CONNECT_WAIT)

    # -- quiet queues (any thread) ------------------------------------------------
    def quiet_mark(self, channel: str) -> tuple[int, int] | None:
        """Return a mark that changes whenever ``channel`` may have had a wake-up.

        None unless the channel is subscribed right now (confirmed by the
        server on the current connection). Every script that makes messages
        of a queue pending, delayed or reserved-then-released publishes on
        its channel, so while the mark is unchanged, a queue found empty is
        still empty.
        """
        with self._lock:
            if self._pubsub is None or channel not in self._confirmed:
                return None
            return (self._epoch, self._heard.get(channel, 0))

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

    def quiet_since(self, channel: str, after: int | None) -> tuple[int, int] | None:
        """Return the mark taken before a probe found ``channel``'s queue empty, if any."""
        with self._lock:
            return self._quiet.get((channel, after))

    def remember(self, channel: str, after: int | None, mark: tuple[int, int] | None) -> None:
        """Record that a probe begun at ``mark`` found the queue empty (None: forget)."""
        with self._lock:
            if mark is None:
                self._quiet.pop((channel, after), None)
            else:
                self._quiet[(channel, after)] = mark

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
            if self._callbacks or self._stopping:
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
        # redis-py leaves pubsub() unannotated.
        pubsub: Any = client.pubsub()  # type: ignore[no-untyped-call]
        with self._lock:
            self._confirmed.clear()
            self._leaving.clear()
            self._epoch += 1
            self._pings = self._pongs = 0  # a new connection answers its own PINGs
            pubsub.ssubscribe(self._control, *self._callbacks)
            self._pubsub = pubsub
            self._client = client  # owns the pool; dropping it closes the socket

    def _disconnect(self) -> None:
        with self._lock:
            self._epoch += 1
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
                raise SlotMoved(f"the server ended the subscription of {channel}")
        elif kind == "smessage":
            self._heard[channel] = self._heard.get(channel, 0) + 1
            return channel
        return None

    def _run(self) -> None:
        try:
            self._reconnect_loop()
        except _Retired:
            return

    def _reconnect_loop(self) -> None:
        backoff = Backoff()
        first = True
        failing = restored = False
        idle_since: float | None = None
        while not self._stopping:
            try:
                self._connect()
                self._drain()  # an SSUBSCRIBE answered with MOVED raises here
            except (redis.RedisError, OSError, ValueError) as exc:
                failing = self._lost(exc, failing)
                self._disconnect()
                idle_since = self._retire_if_idle(idle_since)
                time.sleep(backoff.next())
                continue
            if failing and not restored:
                logger.info("wake-up subscription at %s restored", self._runner.where)
                restored = True
            if not first:
                self.reconnects += 1
                self._wake_all()
            first = False
            started = time.monotonic()
            try:
                self._serve()
            except (redis.RedisError, OSError, ValueError) as exc:
                if time.monotonic() - started >= STABLE_AFTER:
                    failing = restored = False  # a new outage
                    backoff.reset()
                failing = self._lost(exc, failing)
            self._disconnect()
            if failing and not self._stopping:
                time.sleep(backoff.next())

    def _lost(self, exc: BaseException, failing: bool) -> bool:
        """Re-point the route after a failure; log the first failure of an outage."""
        connections = self._runner.connections
        if isinstance(exc, rx.MovedError):
            connections.moved((str(exc.host), int(exc.port)))
        elif connections.kind == "cluster":
            connections.moved(None)  # ask the seed nodes where the slot is now
        if not failing and not self._stopping:
            # type and text: redis-py 8's repr of its errors drops the text
            logger.warning(
                "wake-up subscription at %s lost: %s: %s; reconnecting",
                self._runner.where,
                type(exc).__name__,
                exc,
            )
        return True

    def _serve(self) -> None:
        last_io = time.monotonic()
        idle_since: float | None = None
        # The socket watched and its wait (built once per socket).
        watch: tuple[Any, Callable[[float], set[int]]] | None = None
        while not self._stopping:
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
            if poked or sock.fileno() in ready:
                self._drain(readable=sock.fileno() in ready)
                last_io = time.monotonic()
            elif time.monotonic() - last_io > PING_INTERVAL:
                with self._lock:
                    self._pubsub.ping()
                    self._pings += 1
                last_io = time.monotonic()


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


_LISTENERS: dict[tuple[Any, ...], WakeupListener] = {}
_LISTENERS_LOCK = threading.Lock()


def existing_listener(runner: RedisRunner) -> WakeupListener | None:
    """Return this process's listener for the runner's namespace, if one exists."""
    return _LISTENERS.get((os.getpid(), *runner.identity))


def close_idle_listeners(timeout: float = 5.0) -> int:
    """Close this process's wake-up connections that no waiter uses, at once.

    An idle listener closes its connection by itself after
    :data:`IDLE_LINGER` seconds; call this before stopping a server the
    process is done with (a demo, a test), so the listener does not see its
    connection drop and log a reconnect warning. Waits up to ``timeout``
    seconds in total for the listener threads; returns how many closed.
    """
    pid = os.getpid()
    with _LISTENERS_LOCK:
        listeners = [listener for key, listener in _LISTENERS.items() if key[0] == pid]
    threads = [thread for listener in listeners if (thread := listener.retire_if_idle())]
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return sum(not thread.is_alive() for thread in threads)


def listener_for(runner: RedisRunner) -> WakeupListener:
    """Return this process's listener for the runner's target and namespace."""
    key = (os.getpid(), *runner.identity)
    with _LISTENERS_LOCK:
        listener = _LISTENERS.get(key)
        if listener is None:
            listener = _LISTENERS[key] = WakeupListener(runner)
        return listener


class QueueActivityWaiter:
    """SimpleBroker ``ActivityWaiter`` for one or more queues.

    ``wait(timeout)`` returns True when a wake-up arrived (since the last
    call), False on timeout or when the stop event is set. ``close()`` is
    terminal and idempotent; the waiter owns only its registrations.
    """

    def __init__(self, runner: RedisRunner, queue_names: Sequence[str], stop_event: Any) -> None:
        self._runner = runner
        self._channels = tuple(runner.keys.wake_channel(q) for q in dict.fromkeys(queue_names))
        self._stop_event = stop_event
        self._event = threading.Event()
        self._closed = False
        self._pid = os.getpid()
        self._listener = listener_for(runner)
        self._listener.register(self._channels, self._event.set)

    def wait(self, timeout: float) -> bool:
        """Block until a wake-up, the stop event, or ``timeout`` seconds."""
        if self._pid != os.getpid():
            self._rebind_after_fork()
        deadline = time.monotonic() + max(0.0, float(timeout))
        while True:
            if self._stop_event is not None and self._stop_event.is_set():
                return False
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return self._consume()
            slice_ = remaining if self._stop_event is None else min(remaining, STOP_POLL)
            if self._event.wait(slice_):
                return self._consume()

    def _consume(self) -> bool:
        woken = self._event.is_set()
        self._event.clear()
        return woken

    def _rebind_after_fork(self) -> None:
        self._pid = os.getpid()
        self._event = threading.Event()
        self._listener = listener_for(self._runner)
        self._listener.register(self._channels, self._event.set)

    def close(self) -> None:
        """Terminal, idempotent close; raises the first cleanup failure (with notes)."""
        if self._closed:
            return
        self._closed = True
        failures: list[Exception] = []
        for channel in self._channels:
            try:
                self._listener.unregister(channel, self._event.set)
            except Exception as exc:  # noqa: BLE001 - every cleanup is attempted
                failures.append(exc)
        if failures:
            first = failures[0]
            for later in failures[1:]:
                first.add_note(f"later cleanup failure: {type(later).__name__}: {later}")
            raise first


def open_waiter(
    runner: RedisRunner, queue_names: Sequence[str], stop_event: Any
) -> QueueActivityWaiter:
    """Validate queue names and return a registered waiter."""
    names = list(queue_names)
    if not names:
        raise ValueError("queue_names cannot be empty")
    for name in names:
        validate_queue_name(name)
    return QueueActivityWaiter(runner, names, stop_event)
