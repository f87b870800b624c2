"""The heartbeat thread: renews held leases and recovers expired ones.

It runs on its own thread with its own (synchronous) connection, so a task
that blocks the event loop cannot stop lease renewal, and an event loop busy
with thousands of tasks cannot delay it either. Every ``interval`` seconds it
renews every token the process holds in one round trip; every
``recover_interval`` seconds it releases reservations whose lease expired
(a dead worker's tasks) in one round trip. The recovery script re-checks
each token on the server, so any number of workers can recover at once
without recovering a reservation twice. Recovered messages publish a wake-up,
so idle listeners pick them up at once.

A worker killed at time *t* renewed its leases at most ``interval`` before,
so they expire by *t + lease_seconds* and are recovered by
*t + lease_seconds + recover_interval* (11 s with the defaults).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Final

from simplebroker_redis import Leases, RedisRunner

from .errors import is_transient
from .holdings import Holdings

logger = logging.getLogger("taskiq_simplebroker")

#: Seconds between attempts while the server cannot be reached.
RETRY_SECONDS: Final[float] = 0.5

#: Most expired reservations one recovery round trip releases.
RECOVER_BATCH: Final[int] = 256


class Heartbeat:
    """Daemon thread renewing ``holdings`` and recovering expired leases."""

    def __init__(
        self,
        runner: RedisRunner,
        holdings: Holdings,
        *,
        lease_seconds: float,
        interval: float,
        recover_interval: float,
        on_lost: Callable[[set[str]], None],
    ) -> None:
        self._runner = runner
        self._holdings = holdings
        self._lease_seconds = lease_seconds
        self._interval = interval
        self._recover_interval = recover_interval
        self._on_lost = on_lost
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False
        self.renewals = 0  #: successful renew round trips (observability, tests)
        self.recovered = 0  #: messages this heartbeat recovered

    def start(self) -> None:
        """Start the thread (idempotent)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._run, name="taskiq-simplebroker-heartbeat", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread and wait up to ``timeout`` seconds for it."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

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
                    next_renew = now + self._interval
                if now >= next_recover:
                    self._recover(leases)
                    next_recover = now + self._recover_interval
                self._recovered_from_failure()
            except Exception as exc:  # noqa: BLE001 - the thread must outlive any failure
                self._failed(exc)
                # Renewal is what keeps running tasks ours: try again soon.
                next_renew = next_recover = now + RETRY_SECONDS
            self._stop.wait(max(0.0, min(next_renew, next_recover) - time.monotonic()))

    def _renew(self, leases: Leases) -> None:
        tokens = self._holdings.tokens()
        if not tokens:
            return
        gone = leases.renew(tokens, self._lease_seconds)
        self.renewals += 1
        if gone:
            # A token settled after the snapshot is gone too; only tokens
            # still held were really lost (their lease expired and another
            # worker recovered them).
            lost = self._holdings.drop(gone)
            if lost:
                self._on_lost(lost)

    def _recover(self, leases: Leases) -> None:
        while True:
            recovery = leases.recover(max_tokens=RECOVER_BATCH)
            if recovery.released:
                self.recovered += recovery.released
                logger.warning(
                    "recovered %d task(s) from %d expired reservation(s) of a stopped worker",
                    recovery.released,
                    recovery.tokens,
                )
            if not recovery.more or self._stop.is_set():
                return

    def _failed(self, exc: BaseException) -> None:
        if not self._failing:
            kind = "transient" if is_transient(exc) else "unexpected"
            logger.warning("lease heartbeat failed (%s), retrying: %s", kind, exc)
        else:
            logger.debug("lease heartbeat still failing: %s", exc)
        self._failing = True

    def _recovered_from_failure(self) -> None:
        if self._failing:
            logger.info("lease heartbeat reaches the server again")
        self._failing = False
