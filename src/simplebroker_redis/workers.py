"""What a worker process says about itself: heartbeat records and lease events.

Two consumers of a worker's lease heartbeat (:mod:`.heartbeat`) live here:

- :class:`Presence` writes the process's record into the namespace's
  ``workers`` hash at every beat (``worker_beat.lua``: host, pid, framework,
  the reservation tokens it holds, its renewal counts), and removes it when
  the heartbeat stops; a record older than its time-to-live is dropped by
  the next beat of any worker, so a killed worker disappears by itself. The
  dashboard shows workers from these records, and which worker holds a
  reserved message (its token).
- :func:`observe` registers a :class:`LeaseObserver` for every heartbeat of
  the process: the integrations' metrics (Taskiq middleware, Celery
  signals and events) count renewals, failures and lost leases through it,
  with no work at all when nobody observes.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any, Final, Protocol

from .calls import worker_beat
from .lease_timing import LeaseTiming
from .runner import RedisRunner

#: Seconds between two records of a worker at least (a heartbeat renews
#: more often; the record needs no such pace: one round trip per 5 s).
MIN_BEAT_SECONDS: Final[float] = 5.0

#: A worker's record lives this many beats after its last one.
TTL_BEATS: Final[int] = 6

#: Most tokens one record lists (a worker holds one per reservation batch).
MAX_TOKENS: Final[int] = 500


class LeaseObserver(Protocol):
    """Receives a heartbeat's events (called from the heartbeat thread)."""

    def renewed(self, kind: str, tokens: int) -> None:
        """Hear that one renew round trip for ``tokens`` reservations succeeded."""

    def renew_failed(self, kind: str) -> None:
        """Hear that a beat (renewal or recovery) failed; the heartbeat retries soon."""

    def lost(self, kind: str, tokens: int) -> None:
        """Hear that ``tokens`` held reservations expired and were recovered elsewhere."""

    def recovered(self, kind: str, messages: int) -> None:
        """Hear that the heartbeat recovered ``messages`` of expired reservations."""


_observers: list[LeaseObserver] = []
_observers_lock = threading.Lock()


def observe(observer: LeaseObserver) -> Callable[[], None]:
    """Send the events of every lease heartbeat of this process to ``observer``.

    Returns the function that unregisters it.
    """
    with _observers_lock:
        _observers.append(observer)

    def remove() -> None:
        with _observers_lock:
            if observer in _observers:
                _observers.remove(observer)

    return remove


def notify(event: str, kind: str, count: int = 0) -> None:
    """Call ``event`` on every observer (none registered: nothing happens)."""
    if not _observers:
        return
    with _observers_lock:
        observers = list(_observers)
    for observer in observers:
        try:
            if event == "renew_failed":
                observer.renew_failed(kind)
            else:
                getattr(observer, event)(kind, count)
        except Exception:  # noqa: BLE001, S112 - metrics must never stop a heartbeat
            continue


#: Frameworks whose workers' records name them (the dashboard shows the kind).
FRAMEWORKS: Final[tuple[str, ...]] = ("taskiq", "celery", "protean", "dramatiq")


def worker_kind(framework: str) -> str:
    """Return the kind a worker's record shows for a heartbeat of ``framework``."""
    return framework if framework in FRAMEWORKS else "simplebroker"


class Presence:
    """Writes one worker process's heartbeat record (see the module docstring).

    Args:
        runner: The heartbeat's runner.
        kind: one of :data:`FRAMEWORKS`, or ``simplebroker``.
        timing: The heartbeat's: its interval (shown, and sets the record's
            lifetime) and the lease every renewal grants (shown).
        describe: Returns more fields for the record (queues, say).

    """

    def __init__(
        self,
        runner: RedisRunner,
        *,
        kind: str,
        timing: LeaseTiming,
        describe: Callable[[], Mapping[str, Any]] | None = None,
    ) -> None:
        self._runner = runner
        self._describe = describe
        self.kind = kind
        self.timing = timing
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.id = f"{self.host}:{self.pid}:{uuid.uuid4().hex[:8]}"
        self.started = time.time()
        self.every = max(MIN_BEAT_SECONDS, timing.heartbeat_seconds)
        self.ttl = TTL_BEATS * self.every
        self._next = 0.0  #: monotonic time of the next record
        self._sent: frozenset[str] = frozenset()  #: the tokens the last record listed

    def record(self, tokens: list[str], renewals: int, failures: int) -> dict[str, Any]:
        """Return the record of one beat."""
        record: dict[str, Any] = {
            "kind": self.kind,
            "host": self.host,
            "pid": self.pid,
            "started": round(self.started, 3),
            "interval": self.every,
            "lease_seconds": self.timing.lease_seconds,
            "held": len(tokens),
            "tokens": tokens[:MAX_TOKENS],
            "renewals": renewals,
            "renew_failures": failures,
        }
        if self._describe is not None:
            record.update(self._describe())
        return record

    def beat(self, tokens: list[str], renewals: int, failures: int) -> None:
        """Store this beat's record (one round trip) when one is due.

        One is due every ``every`` seconds, and at the heartbeat's next beat
        after the held tokens changed (so a page shows who holds a message
        within one heartbeat interval of its reservation).
        """
        now = time.monotonic()
        held = frozenset(tokens)
        if now < self._next and held == self._sent:
            return
        self._next, self._sent = now + self.every, held
        if os.getpid() != self.pid:  # a forked child is a worker of its own
            self.pid = os.getpid()
            self.id = f"{self.host}:{self.pid}:{uuid.uuid4().hex[:8]}"
        self._runner.run(worker_beat(self.id, self.record(tokens, renewals, failures), self.ttl))

    def leave(self) -> None:
        """Remove the record (best effort: a stopped server lets it expire instead)."""
        try:
            self._runner.run(worker_beat(self.id, None, self.ttl))
        except Exception:  # noqa: BLE001 - the record expires by itself
            return
