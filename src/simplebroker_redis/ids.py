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

import time
from typing import Final

from simplebroker.ext import BackendPlugin, TimestampGenerator

#: The logical counter's bits of a hybrid ID (SimpleBroker's low 12 bits).
COUNTER_MASK: Final[int] = 0xFFF


class HighWaterClock(TimestampGenerator):
    """SimpleBroker's generator plus one hook: learn IDs the server committed.

    ``TimestampGenerator`` keeps its cache in ``_last_ts`` under ``_lock``
    and its runner in ``_runner``; this subclass is the only place that
    touches them, and the exact ``backend_api_version`` handshake pins the
    simplebroker release it was written against.
    """

    @classmethod
    def offline(cls, backend_plugin: BackendPlugin) -> HighWaterClock:
        """Return a clock that never reads the server (an asyncio writer's).

        Its cache starts at 0 and learns only what :meth:`observe` is told:
        the write scripts take the larger of a candidate and the durable
        high-water + 1, so a candidate need not know the high-water, and an
        event loop must not block on a read.
        """
        # No runner: _initialize() below never asks the plugin for the high-water.
        return cls(None, backend_plugin=backend_plugin)  # type: ignore[arg-type]

    def _initialize(self) -> None:
        if self._runner is None:
            self._initialized = True
            return
        super()._initialize()

    def observe(self, committed: int) -> None:
        """Raise the cached high-water to ``committed`` (never lowers it)."""
        with self._lock:
            self._initialized = True
            if committed > self._last_ts:
                self._last_ts = committed

    def candidates(self, count: int) -> list[int]:
        """Return ``count`` increasing candidate IDs without any I/O.

        The first call in a process reads the durable high-water once
        (never for an :meth:`offline` clock).
        """
        return self._reserve_candidates(count)

    def exhausted(self) -> bool:
        """Return True while the next candidate would wait for the clock.

        That is while the cached high-water's logical counter is spent and
        the clock has not passed its time: :meth:`candidates` then sleeps,
        so an asyncio caller awaits this turning False first.
        """
        with self._lock:
            last = self._last_ts
        if last & COUNTER_MASK != COUNTER_MASK:
            return False
        return time.time_ns() & ~COUNTER_MASK <= last & ~COUNTER_MASK
