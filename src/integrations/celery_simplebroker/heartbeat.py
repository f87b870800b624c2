"""The heartbeat thread: renews held leases, recovers expired ones, keeps bindings alive.

It runs on its own thread (commands go through the runner's pool), so a task
that runs for hours inside ``drain_events`` (``-P solo``), or a pool that
keeps the consumer busy, cannot stop lease renewal. Every ``interval``
seconds it renews every reservation the process holds in one round trip and
restarts the lifetime of the bindings of expiring queues it consumes
(Celery's pidbox); every ``recover_interval`` seconds it releases
reservations whose lease expired, whoever held them, in one round trip. The
recovery script re-checks each token on the server, so any number of
workers can recover at once. Recovered messages publish a wake-up, so idle
workers take them at once.

A worker killed at time *t* renewed its leases at most ``interval`` before,
so its messages are pending again by *t + lease_seconds + recover_interval*
(11 s by default), with no new traffic needed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Final

from simplebroker_redis import Leases

logger = logging.getLogger("celery_simplebroker")

#: Seconds between attempts while the server cannot be reached.
RETRY_SECONDS: Final[float] = 0.5

#: Most expired reservations one recovery round trip releases.
RECOVER_BATCH: Final[int] = 256


class Holdings:
    """Thread-safe count of unsettled messages per reservation token of a process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[str, int] = {}

    def hold(self, token: str, count: int) -> None:
        """Start holding ``count`` messages of a reservation."""
        with self._lock:
            self._open[token] = self._open.get(token, 0) + count

    def settle(self, token: str, count: int = 1) -> None:
        """Stop holding ``count`` messages of ``token``."""
        with self._lock:
            left = self._open.get(token)
            if left is None:
                return
            if left <= count:
                del self._open[token]
            else:
                self._open[token] = left - count

    def drop(self, tokens: Iterable[str]) -> set[str]:
        """Stop holding ``tokens`` entirely; return those that were held."""
        with self._lock:
            return {token for token in tokens if self._open.pop(token, None) is not None}

    def tokens(self) -> list[str]:
        """Return a snapshot of the held tokens."""
        with self._lock:
            return list(self._open)


class Heartbeat:
    """Daemon thread renewing ``holdings``, recovering expired leases, refreshing bindings."""

    def __init__(
        self,
        leases: Leases,
        holdings: Holdings,
        *,
        lease_seconds: float,
        interval: float,
        recover_interval: float,
        refresh: Callable[[], None],
    ) -> None:
        self._leases = leases
        self._holdings = holdings
        self._lease_seconds = lease_seconds
        self._interval = interval
        self._recover_interval = recover_interval
        self._refresh = refresh
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False

    def start(self) -> None:
        """Start the thread (idempotent)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._run, name="celery-simplebroker-heartbeat", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread and wait up to ``timeout`` seconds for it."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _run(self) -> None:
        next_renew = next_recover = time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            try:
                if now >= next_renew:
                    self._renew()
                    self._refresh()
                    next_renew = now + self._interval
                if now >= next_recover:
                    self._recover()
                    next_recover = now + self._recover_interval
                if self._failing:
                    logger.info("lease heartbeat reaches the server again")
                    self._failing = False
            except Exception as exc:  # noqa: BLE001 - the thread must outlive any failure
                if not self._failing:
                    logger.warning("lease heartbeat failed, retrying: %s", exc)
                self._failing = True
                next_renew = next_recover = now + RETRY_SECONDS
            self._stop.wait(max(0.0, min(next_renew, next_recover) - time.monotonic()))

    def _renew(self) -> None:
        tokens = self._holdings.tokens()
        if not tokens:
            return
        gone = self._leases.renew(tokens, self._lease_seconds)
        if gone:
            # A token settled after the snapshot is gone too; only tokens
            # still held were really lost (expired and recovered elsewhere).
            lost = self._holdings.drop(gone)
            if lost:
                logger.warning(
                    "%d reservation(s) expired before renewal; their messages may run again",
                    len(lost),
                )

    def _recover(self) -> None:
        while not self._stop.is_set():
            recovery = self._leases.recover(max_tokens=RECOVER_BATCH)
            if recovery.released:
                logger.warning(
                    "recovered %d message(s) from %d expired reservation(s) of a stopped worker",
                    recovery.released,
                    recovery.tokens,
                )
            if not recovery.more:
                return
