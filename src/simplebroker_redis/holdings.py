"""What a worker process holds, and whether each lease is still its own.

A worker process (Taskiq, Celery, Protean) reserves messages under tokens
(:mod:`.leases`). :class:`Holdings` counts, per token, the messages the
process still holds; the lease heartbeat (:mod:`.heartbeat`) renews exactly
those tokens and reports those it lost. It also knows each token's lease
deadline on the **server's** clock (from the reservation's reply, then
from every renewal's), and :class:`ServerClock` estimates the server's time
now, so a worker can ask, right before it starts a task, whether the lease
may have run out meanwhile (the process was stopped, or cut off from the
server, for longer than the lease): :meth:`Holdings.standing`.

The API the integrations use (Taskiq, Protean, and Celery's transport):

- ``holdings.holder``: pass it to ``reserve``/``reserve_queues``
  (``holder=``), so the recovery step that opens this worker's own
  reservations never takes the leases this worker is about to renew;
- :meth:`Holdings.hold` with the lease's ``deadline_ns``, and
  ``holdings.clock.observe(lease.created_ns, sent, received)``;
- :meth:`Holdings.standing` before starting a task: ``HELD`` start it,
  ``EXPIRED`` hand it back (``release``, its delivery taken back: it never
  ran), ``LOST`` drop it (another worker has it now), ``LET_GO`` drop it
  (this process settled or handed back every message of it);
- :meth:`Holdings.settling` when a message's settlement (acknowledgement,
  rejection) is sent, and :meth:`Holdings.settled` once it landed (or
  failed for good; :meth:`Holdings.unsettle` when it did not happen and
  the message stays held): the token stays held, renewed and spared by
  this worker's recovery, until the settlement lands (a partition may hold
  it up for longer than the lease), and a renewal that finds it gone
  because the settlement landed does not report it lost;
- :meth:`Holdings.let_go` for messages given up without a settlement
  that waits for the token (handed back, or settled by a script whose
  outcome its caller tracks).

``LOST`` means one thing: the server dropped a token while this process
still held messages of it that it was not settling, i.e. its lease ran
out and another worker recovered it. A token this process let go of,
however recently, and whatever the server says about it since, reads
``LET_GO``: an event loop that checks its delivered tasks while another
thread settles them must not take its own settlements for a takeover
(issue 42: a healthy Celery worker restarted its consumer so).
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Iterable
from typing import Final

from .calls import new_holder

#: Seconds an estimate of the server's clock is trusted before a newer
#: reply replaces it even with a longer round trip (clocks drift apart).
CLOCK_FRESH_SECONDS: Final[float] = 60.0

#: Lost tokens remembered (the oldest are forgotten first): far more than a
#: process holds between two checks of what it delivered.
LOST_REMEMBERED: Final[int] = 4096


class ServerClock:
    """An estimate of the server's clock, from replies that carried its time.

    A reply that says the server's time was ``server_ns`` was computed
    after the request was sent, so ``server_ns`` minus the local monotonic
    time of the send overestimates the offset between the clocks by at most
    the round trip. The estimate keeps the observation with the shortest
    round trip (refreshed every :data:`CLOCK_FRESH_SECONDS`), so it runs
    ahead of the server by at most that round trip: a lease that the
    estimate calls expired may have a little time left, never the reverse.
    Thread-safe.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._offset: int | None = None  #: server ns minus local monotonic ns
        self._rtt = 0.0  #: round trip of the observation behind the offset
        self._at = 0.0  #: when it was made (monotonic seconds)

    def observe(self, server_ns: int, sent: float, received: float | None = None) -> None:
        """Learn from a reply: the server's time ``server_ns``, between ``sent`` and ``received``.

        ``sent`` and ``received`` are ``time.monotonic()`` readings taken
        before the request was sent and after its reply arrived (now when
        omitted).
        """
        if received is None:
            received = time.monotonic()
        rtt = max(0.0, received - sent)
        offset = server_ns - round(sent * 1e9)
        with self._lock:
            stale = received - self._at > CLOCK_FRESH_SECONDS
            if self._offset is None or stale or rtt <= self._rtt:
                self._offset, self._rtt, self._at = offset, rtt, received

    def local(self, server_ns: int) -> float | None:
        """Return when the server's clock reads ``server_ns``, in ``time.monotonic()`` s (or None).

        Never later than it does: the estimate runs ahead of the server.
        """
        with self._lock:
            offset = self._offset
        return None if offset is None else (server_ns - offset) / 1e9

    def now_ns(self) -> int | None:
        """Return the estimate of the server's time now (ns), None before any reply."""
        with self._lock:
            offset = self._offset
        return None if offset is None else time.monotonic_ns() + offset


class Standing(enum.Enum):
    """Whether a held message may still be started (see :meth:`Holdings.standing`)."""

    #: Held here, and its lease runs past the server's estimated time now.
    HELD = "held"
    #: Held here, but its lease's known deadline passed: another worker may
    #: have it now. Do not start it; hand it back (it never ran).
    EXPIRED = "expired"
    #: Taken over: a renewal found the token gone while this process still
    #: held messages of it that it was not settling (its lease ran out and
    #: another worker recovered it). Do not start it: it may run there.
    LOST = "lost"
    #: Not held here any more because this process settled or handed back
    #: every message of it (or never held it): nothing to start, nothing lost.
    LET_GO = "let go"


class Holdings:
    """Thread-safe count of the messages a process holds, per reservation token.

    The process holds a token while any of its messages is neither
    acknowledged nor handed back; the heartbeat renews exactly those tokens
    and records each renewed lease's deadline. ``holder`` names this
    worker's reservations (a fresh one unless given; see the module
    docstring), ``clock`` estimates the server's time.
    """

    def __init__(self, holder: str | None = None) -> None:
        self._lock = threading.Lock()
        self._open: dict[str, int] = {}
        self._settling: dict[str, int] = {}  #: of those, acknowledgements under way
        self._deadlines: dict[str, int] = {}
        self._lost: dict[str, None] = {}  #: tokens found taken over, oldest first
        self.holder = holder or new_holder()
        self.clock = ServerClock()

    def hold(self, token: str, count: int, deadline_ns: int | None = None) -> None:
        """Start holding ``count`` messages of a reservation whose lease ends at ``deadline_ns``.

        ``deadline_ns``: the lease's deadline on the server's clock
        (``Lease.deadline_ns``); None for a lease that never expires, or
        when unknown (never reported expired then).
        """
        with self._lock:
            self._open[token] = self._open.get(token, 0) + count
            if deadline_ns is not None:
                self._deadlines[token] = deadline_ns

    def renewed(self, tokens: Iterable[str], deadline_ns: int) -> None:
        """Record that the leases of ``tokens`` (those still held) now end at ``deadline_ns``."""
        with self._lock:
            for token in tokens:
                if token in self._open:
                    self._deadlines[token] = deadline_ns

    def settling(self, token: str, count: int = 1) -> None:
        """Note that the settlement of ``count`` held messages of ``token`` is under way.

        They stay held (renewed) until :meth:`settled` (or :meth:`unsettle`);
        a renewal that finds the token gone meanwhile does not report it
        lost if only such messages were left (:meth:`drop_lost`), and
        :meth:`busy` does not count them.
        """
        with self._lock:
            if token in self._open:
                self._settling[token] = min(self._open[token], self._settling.get(token, 0) + count)

    def settled(self, token: str, count: int = 1) -> bool:
        """Stop holding ``count`` messages of ``token`` whose settlement (:meth:`settling`) is over.

        It landed, or failed for good. False if the token was not held.
        """
        with self._lock:
            if token not in self._open:
                return False
            self._settling[token] = max(0, self._settling.get(token, 0) - count)
            return self._release(token, count)

    def unsettle(self, token: str, count: int = 1) -> None:
        """Note that the settlement of ``count`` messages of ``token`` failed; they stay held."""
        with self._lock:
            if token in self._settling:
                self._settling[token] = max(0, self._settling[token] - count)

    def let_go(self, token: str, count: int = 1) -> bool:
        """Stop holding ``count`` messages of ``token`` not being settled; False if it was not held.

        Handed back, or settled by a script whose outcome the caller tracks
        itself. Messages being settled (:meth:`settling`) end with
        :meth:`settled` instead, so that the rest stay counted as not.
        """
        with self._lock:
            return self._release(token, count)

    def _release(self, token: str, count: int) -> bool:
        """Stop holding ``count`` messages of ``token`` (under the lock); False if not held."""
        left = self._open.get(token)
        if left is None:
            return False
        if left <= count:
            self._forget(token)
        else:
            self._open[token] = left - count
            if self._settling.get(token, 0) > left - count:
                self._settling[token] = left - count
        return True

    def _forget(self, token: str) -> bool:
        """Forget ``token`` entirely (under the lock); True if it was held."""
        self._deadlines.pop(token, None)
        self._settling.pop(token, None)
        return self._open.pop(token, None) is not None

    def holds(self, token: str) -> bool:
        """Return whether a message of ``token`` is still held."""
        with self._lock:
            return token in self._open

    def deadline_ns(self, token: str) -> int | None:
        """Return the lease deadline of ``token`` last learned (server ns), None if unknown."""
        with self._lock:
            return self._deadlines.get(token)

    def local_deadline(self, token: str) -> float | None:
        """Return the last known lease deadline of ``token`` in ``time.monotonic()`` s, or None."""
        deadline = self.deadline_ns(token)
        return None if deadline is None else self.clock.local(deadline)

    def standing(self, token: str) -> Standing:
        """Return whether a message of ``token`` may be started now (see :class:`Standing`).

        Compares the lease's last known deadline with the server's time as
        :attr:`clock` estimates it (never behind the server's): a process
        that was stopped, or cut off from the server, for longer than the
        lease finds its leases expired here even before the heartbeat could
        ask the server. A token no longer held is ``LOST`` only when a
        renewal found it taken over (:meth:`drop_lost`); one this process
        let go of is ``LET_GO``, whatever the server says about it since.
        """
        with self._lock:
            if token not in self._open:
                return Standing.LOST if token in self._lost else Standing.LET_GO
            deadline = self._deadlines.get(token)
        if deadline is None:
            return Standing.HELD
        now = self.clock.now_ns()
        if now is not None and now >= deadline:
            return Standing.EXPIRED
        return Standing.HELD

    def drop(self, tokens: Iterable[str]) -> set[str]:
        """Stop holding ``tokens`` entirely (handed back: not lost); return those that were held."""
        with self._lock:
            return {token for token in tokens if self._forget(token)}

    def drop_lost(self, tokens: Iterable[str]) -> set[str]:
        """Stop holding ``tokens`` a renewal found gone; return those really lost.

        A token whose every remaining message was being settled
        (:meth:`settling`) went because its settlement landed, and one no
        longer held was let go here: neither is lost. The others read
        ``LOST`` from now on (:meth:`standing`).
        """
        with self._lock:
            lost = set()
            for token in tokens:
                held = self._open.get(token, 0)
                if held > self._settling.get(token, 0):
                    lost.add(token)
                    self._remember_lost(token)
                self._forget(token)
            return lost

    def _remember_lost(self, token: str) -> None:
        """Record ``token`` as taken over (under the lock), forgetting the oldest past the cap."""
        self._lost[token] = None
        while len(self._lost) > LOST_REMEMBERED:
            del self._lost[next(iter(self._lost))]

    def busy(self) -> bool:
        """Return whether any held message is neither acknowledged nor being acknowledged."""
        with self._lock:
            return any(count > self._settling.get(token, 0) for token, count in self._open.items())

    def tokens(self) -> list[str]:
        """Return a snapshot of the held tokens."""
        with self._lock:
            return list(self._open)

    def __len__(self) -> int:
        with self._lock:
            return len(self._open)
