"""Message identity: hybrid timestamp candidates and the durable high-water.

IDs follow SimpleBroker's hybrid encoding (``time.time_ns()`` with the low
12 bits replaced by a logical counter). The client proposes a candidate from
its own clock with SimpleBroker's ``TimestampGenerator``; the write script
then takes the larger of that candidate and ``last_ts + 1`` and commits the
message and the new high-water mark together. A client whose clock lags
another writer therefore still writes in one round trip, and no two
committed messages can share an ID.
"""

from __future__ import annotations

from simplebroker.ext import TimestampGenerator


class HighWaterClock(TimestampGenerator):
    """SimpleBroker's generator plus one hook: learn IDs the server committed.

    ``TimestampGenerator`` keeps its cache in ``_last_ts`` under ``_lock``;
    this subclass is the only place that touches them, and the exact
    ``backend_api_version`` handshake pins the simplebroker release it was
    written against.
    """

    def observe(self, committed: int) -> None:
        """Raise the cached high-water to ``committed`` (never lowers it)."""
        with self._lock:
            self._initialized = True
            if committed > self._last_ts:
                self._last_ts = committed

    def candidates(self, count: int) -> list[int]:
        """Return ``count`` increasing candidate IDs without any I/O.

        The first call in a process reads the durable high-water once.
        """
        return self._reserve_candidates(count)
