"""Lease heartbeats for integrations: keep what a process holds, recover what others lost.

A worker process (Taskiq, Celery, Protean) reserves messages under tokens
(:mod:`.leases`). :class:`Holdings` counts, per token, the messages the
process still holds; :class:`LeaseHeartbeat` is a daemon thread that every
``heartbeat_seconds`` renews every held token in one round trip, and every
``recover_seconds`` releases reservations whose lease expired, whoever
held them (a dead worker's), in one round trip (the timing comes from
:func:`~.integration.lease_timing`). The recovery script re-checks each
token on the server, so any number of workers can recover at once;
recovered messages publish a wake-up, so idle workers take them at once.

The thread uses the synchronous runner (its own pool), so neither a task
that blocks an event loop nor a loop busy with thousands of tasks can delay
renewal. A worker killed at time *t* renewed its leases at most
``heartbeat_seconds`` before, so its messages are pending again by *t +
lease_seconds + recover_seconds*.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

from .integration import LeaseTiming
from .leases import Leases
from .runner import RedisRunner
from .workers import Presence, notify, worker_kind

#: Seconds between attempts while the server cannot be reached.
RETRY_SECONDS: Final[float] = 0.5

#: Most expired reservations one recovery round trip releases.
RECOVER_BATCH: Final[int] = 256


class Holdings:
    """Thread-safe count of the messages a process holds, per reservation token.

    The process holds a token while any of its messages is neither
    acknowledged nor handed back; the heartbeat renews exactly those tokens.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[str, int] = {}

    def hold(self, token: str, count: int) -> None:
        """Start holding ``count`` messages of a reservation."""
        with self._lock:
            self._open[token] = self._open.get(token, 0) + count

    def let_go(self, token: str, count: int = 1) -> bool:
        """Stop holding ``count`` messages of ``token``; False if it was not held."""
        with self._lock:
            left = self._open.get(token)
            if left is None:
                return False
            if left <= count:
                del self._open[token]
            else:
                self._open[token] = left - count
            return True

    def holds(self, token: str) -> bool:
        """Return whether a message of ``token`` is still held."""
        with self._lock:
            return token in self._open

    def drop(self, tokens: Iterable[str]) -> set[str]:
        """Stop holding ``tokens`` entirely; return those that were held."""
        with self._lock:
            return {token for token in tokens if self._open.pop(token, None) is not None}

    def busy(self) -> bool:
        """Return whether any message is still held."""
        return bool(self._open)

    def tokens(self) -> list[str]:
        """Return a snapshot of the held tokens."""
        with self._lock:
            return list(self._open)

    def __len__(self) -> int:
        with self._lock:
            return len(self._open)


class LeaseHeartbeat:
    """Daemon thread renewing ``holdings`` and recovering expired leases.

    Args:
        runner: The synchronous runner the thread sends its scripts through.
        holdings: The tokens this process holds.
        timing: The lease every renewal grants, the seconds between
            renewals (and ``on_beat`` calls) and between recovery passes.
        framework: ``taskiq``, ``celery`` or ``protean``: outages, recoveries
            and lost leases are logged on ``<framework>_simplebroker`` (one
            warning per outage), the thread is
            ``<framework>-simplebroker-heartbeat`` and the worker's record
            names the framework (:func:`~.workers.worker_kind`).
        on_beat: Called (from the thread) after every renewal, for whatever
            else must stay alive at the same pace (Celery's bindings).
        describe: More fields for the worker's heartbeat record (see
            :class:`~.workers.Presence`); every beat also stores the record.

    """

    def __init__(
        self,
        runner: RedisRunner,
        holdings: Holdings,
        timing: LeaseTiming,
        *,
        framework: str,
        on_beat: Callable[[], None] | None = None,
        describe: Callable[[], Mapping[str, Any]] | None = None,
    ) -> None:
        self.kind = worker_kind(framework)
        self.presence = Presence(runner, kind=self.kind, timing=timing, describe=describe)
        self.renewals = 0  #: successful renew round trips (observability, tests)
        self.renew_failures = 0  #: beats that failed (the thread retried)
        self.recovered = 0  #: messages this heartbeat recovered
        self._runner = runner
        self._holdings = holdings
        self._timing = timing
        self._on_beat = on_beat
        self._logger = logging.getLogger(f"{framework}_simplebroker")
        self._name = f"{framework}-simplebroker-heartbeat"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False

    def start(self) -> None:
        """Start the thread (idempotent)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread and wait up to ``timeout`` seconds for it."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        if thread is not None and not self._failing:
            # A server that failed the last beat would only delay the stop:
            # the record then expires by itself.
            self.presence.leave()

    def _run(self) -> None:
        leases: Leases | None = None
        next_renew = next_recover = time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            try:
                if leases is None:
                    leases = Leases(self._runner)  # validates the namespace once
                if now >= next_renew:
                    self._renew(leases)
                    self.presence.beat(self._holdings.tokens(), self.renewals, self.renew_failures)
                    if self._on_beat is not None:
                        self._on_beat()
                    next_renew = now + self._timing.heartbeat_seconds
                if now >= next_recover:
                    self._recover(leases)
                    next_recover = now + self._timing.recover_seconds
                if self._failing:
                    self._logger.info("lease heartbeat reaches the server again")
                    self._failing = False
            except Exception as exc:  # noqa: BLE001 - the thread must outlive any failure
                if not self._failing:
                    self._logger.warning("lease heartbeat failed, retrying: %s", exc)
                else:
                    self._logger.debug("lease heartbeat still failing: %s", exc)
                self._failing = True
                self.renew_failures += 1
                notify("renew_failed", self.kind)
                # Renewal is what keeps running work ours: try again soon.
                next_renew = next_recover = now + RETRY_SECONDS
            self._stop.wait(max(0.0, min(next_renew, next_recover) - time.monotonic()))

    def _renew(self, leases: Leases) -> None:
        tokens = self._holdings.tokens()
        if not tokens:
            return
        gone = leases.renew(tokens, self._timing.lease_seconds)
        self.renewals += 1
        notify("renewed", self.kind, len(tokens))
        if gone:
            # A token settled after the snapshot is gone too; only tokens
            # still held were really lost (their lease expired and another
            # process recovered them).
            lost = self._holdings.drop(gone)
            if lost:
                notify("lost", self.kind, len(lost))
                self._logger.warning(
                    "%d reservation(s) expired before renewal (was this process paused?) and "
                    "were recovered elsewhere: their messages may be handled again",
                    len(lost),
                )

    def _recover(self, leases: Leases) -> None:
        while not self._stop.is_set():
            recovery = leases.recover(max_tokens=RECOVER_BATCH)
            if recovery.released:
                self.recovered += recovery.released
                notify("recovered", self.kind, recovery.released)
                self._logger.warning(
                    "recovered %d message(s) from %d expired reservation(s) of a stopped worker",
                    recovery.released,
                    recovery.tokens,
                )
            if not recovery.more:
                return
