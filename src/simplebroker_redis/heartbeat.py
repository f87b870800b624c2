"""Lease heartbeats for integrations: keep what a process holds, recover what others lost.

A worker process (Taskiq, Celery, Protean) reserves messages under tokens
(:mod:`.leases`); :class:`~.holdings.Holdings` counts, per token, the
messages the process still holds. :class:`LeaseHeartbeat` is a daemon
thread that every ``heartbeat_seconds`` renews every held token in one
round trip (recording each new deadline on the server's clock), and right
after a renewal, at most every ``recover_seconds``, releases reservations
whose lease expired, in one round trip (the timing comes from
:func:`~.integration.lease_timing`). The recovery script re-checks each
token on the server, so any number of workers can recover at once;
recovered messages publish a wake-up, so idle workers take them at once.

A worker never recovers its own live reservations: the recovery pass names
the tokens this process holds (``recover.lua`` leaves them alone, however
late their renewal: after a partition the recovery request can reach the
server before the renewal), and it runs only after a renewal succeeded
since the last failure. What it does recover is either another worker's
(stopped, dead, or cut off) or one this process gave up without handing
back.

With ``own_renewal`` (Celery's transport; the other integrations still run
everything on one thread: with Protean's engine the split made a test of
its two consumer groups time out, not yet understood), renewal has a thread
and a connection pool of its own (``runner.sibling()``);
the worker's record, ``on_beat`` and the recovery passes run in a second
thread on the runner's pool. So nothing waits in front of a renewal:
neither a task that blocks an event loop, nor a loop busy with thousands
of tasks, nor the other round trips of the heartbeat itself (issue 42:
with 0.3 s added to every packet, a renewal queued behind the record, the
bindings' refresh and a recovery pass came after a 2 s lease had run out,
and another worker ran the task again). A worker killed at time *t* renewed its leases at most
``heartbeat_seconds`` before, so its messages are pending again by *t +
lease_seconds + max(heartbeat_seconds, recover_seconds)* (another worker's
recovery follows its renewals).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

from .holdings import Holdings, ServerClock, Standing
from .lease_timing import LeaseTiming
from .leases import Leases
from .runner import RedisRunner
from .workers import Presence, notify, worker_kind

__all__ = ["Holdings", "LeaseHeartbeat", "ServerClock", "Standing"]

#: Seconds between attempts while the server cannot be reached.
RETRY_SECONDS: Final[float] = 0.5

#: Most expired reservations one recovery round trip releases.
RECOVER_BATCH: Final[int] = 256


class LeaseHeartbeat:
    """Daemon threads renewing ``holdings`` and recovering expired leases.

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
        own_renewal: bool = False,
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
        self._thread: threading.Thread | None = None  #: renewals
        self._upkeep: threading.Thread | None = None  #: the record, on_beat, recovery
        self._renewed = threading.Event()  #: set by each renewal, taken by the upkeep
        self._renewer: RedisRunner | None = None  #: the renewals' own pool
        self._failing = False
        #: Renewals on a thread and a pool of their own (Celery's transport); else
        #: one thread does everything (Taskiq, Protean, Dramatiq for now).
        self._own_renewal = own_renewal

    def start(self) -> None:
        """Start the threads (idempotent)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._renewed.clear()
        if not self._own_renewal:
            self._thread = threading.Thread(target=self._run_together, name=self._name, daemon=True)
            self._thread.start()
            return
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._upkeep = threading.Thread(
            target=self._run_upkeep, name=f"{self._name}-upkeep", daemon=True
        )
        self._thread.start()
        self._upkeep.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the threads and wait up to ``timeout`` seconds for each."""
        self._stop.set()
        self._renewed.set()  # wakes the upkeep thread
        thread, self._thread = self._thread, None
        upkeep, self._upkeep = self._upkeep, None
        for each in (thread, upkeep):
            if each is not None and each is not threading.current_thread():
                each.join(timeout)
        if thread is not None and not self._failing:
            # A server that failed the last beat would only delay the stop:
            # the record then expires by itself.
            self.presence.leave()
        if self._renewer is not None:
            self._renewer.close()  # its pool reconnects if the heartbeat starts again

    def _run(self) -> None:
        """Renew what is held, and nothing else, on a connection of its own (one thread)."""
        leases: Leases | None = None
        while not self._stop.is_set():
            now = time.monotonic()
            try:
                if leases is None:
                    if self._renewer is None:
                        self._renewer = self._runner.sibling()
                    leases = Leases(self._renewer)  # validates the namespace once
                self._renew(leases)
                self._reached()
                self._renewed.set()
                wait = self._timing.heartbeat_seconds
            except Exception as exc:  # noqa: BLE001 - the thread must outlive any failure
                self._failed(exc)
                # Renewal is what keeps running work ours: try again soon.
                wait = RETRY_SECONDS
            self._stop.wait(max(0.0, now + wait - time.monotonic()))

    def _run_together(self) -> None:
        """Renew, beat and recover on one thread and the runner's pool (``own_renewal`` off)."""
        leases: Leases | None = None
        next_renew = next_recover = time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            try:
                if leases is None:
                    leases = Leases(self._runner)  # validates the namespace once
                # After a failure, renew before anything else: this
                # process's leases may have run out meanwhile.
                if now >= next_renew or self._failing:
                    self._renew(leases)
                    self.presence.beat(self._holdings.tokens(), self.renewals, self.renew_failures)
                    if self._on_beat is not None:
                        self._on_beat()
                    next_renew = now + self._timing.heartbeat_seconds
                if now >= next_recover:
                    self._recover(leases)
                    next_recover = now + self._timing.recover_seconds
                self._reached()
            except Exception as exc:  # noqa: BLE001 - the thread must outlive any failure
                self._failed(exc)
                # Renewal is what keeps running work ours: try again soon.
                next_renew = next_recover = now + RETRY_SECONDS
            self._stop.wait(max(0.0, min(next_renew, next_recover) - time.monotonic()))

    def _reached(self) -> None:
        """Note a renewal that reached the server (said once, after failures)."""
        if self._failing:
            self._logger.info("lease heartbeat reaches the server again")
            self._failing = False

    def _failed(self, exc: Exception) -> None:
        """Note a failed renewal (a warning for the first of a run of failures)."""
        if not self._failing:
            self._logger.warning("lease heartbeat failed, retrying: %s", exc)
        else:
            self._logger.debug("lease heartbeat still failing: %s", exc)
        self._failing = True
        self.renew_failures += 1
        notify("renew_failed", self.kind)

    def _run_upkeep(self) -> None:
        """Store the worker's record, call ``on_beat``, recover expired leases (one thread).

        Each beat follows a renewal that succeeded (``on_beat`` ends an
        outage, sends deferred settlements), and so does a recovery pass (at
        most every ``recover_seconds``): after an outage this process renews
        before it recovers, and no pass is sent while renewals fail.
        """
        leases: Leases | None = None
        next_recover = time.monotonic()
        failing = False
        while not self._stop.is_set():
            renewed = self._renewed.wait(min(self._timing.recover_seconds, RETRY_SECONDS))
            if self._stop.is_set():
                return
            now = time.monotonic()
            try:
                if leases is None:
                    leases = Leases(self._runner)
                if renewed:
                    self._renewed.clear()
                    # Recovery right after a renewal that succeeded, never later: a
                    # pass sent into a partition reaches the server at the heal,
                    # when the other workers' leases ran out because of it.
                    if now >= next_recover and not self._failing:
                        self._recover(leases)
                        next_recover = now + self._timing.recover_seconds
                    self.presence.beat(self._holdings.tokens(), self.renewals, self.renew_failures)
                    if self._on_beat is not None:
                        self._on_beat()
                failing = False
            except Exception as exc:  # noqa: BLE001 - the thread must outlive any failure
                if not failing:
                    self._logger.debug("lease upkeep failed, retrying: %s", exc)
                failing = True
                next_recover = now + RETRY_SECONDS

    def _renew(self, leases: Leases) -> None:
        holdings = self._holdings
        tokens = holdings.tokens()
        if not tokens:
            return
        lease = self._timing.lease_seconds
        sent = time.monotonic()
        renewal = leases.renewal(tokens, lease)
        holdings.clock.observe(renewal.now_ns, sent)
        holdings.renewed(
            (token for token in tokens if token not in renewal.lost),
            renewal.now_ns + round(lease * 1e9),
        )
        self.renewals += 1
        notify("renewed", self.kind, len(tokens))
        if renewal.lost:
            # A token settled after the snapshot is gone too; only tokens
            # still held were really lost: their lease ran out and another
            # worker recovered them (this process's recovery spares what it
            # holds, see the module docstring).
            lost = holdings.drop_lost(renewal.lost)
            if lost:
                notify("lost", self.kind, len(lost))
                self._logger.warning(
                    "%d reservation(s) held here ran out before this process could renew "
                    "them (was it stopped, or cut off from the server, longer than the %g s "
                    "lease?) and another worker recovered them: their tasks may run there "
                    "again, and are not started here",
                    len(lost),
                    lease,
                )

    def _recover(self, leases: Leases) -> None:
        while not self._stop.is_set():
            recovery = leases.recover(max_tokens=RECOVER_BATCH, spare=self._holdings.tokens())
            if recovery.released:
                self.recovered += recovery.released
                notify("recovered", self.kind, recovery.released)
                self._logger.warning(
                    "recovered %d message(s) from %d expired reservation(s) that no live "
                    "holder renewed (a worker that stopped, died or lost the server, or "
                    "reservations this process gave up)",
                    recovery.released,
                    recovery.tokens,
                )
            if not recovery.more:
                return
