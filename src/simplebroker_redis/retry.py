"""Backoff rules shared by every retry loop of the sync and asyncio paths.

Two kinds of waiting exist, each defined once here:

- :class:`Backoff`: reconnecting after a lost connection (Pub/Sub listeners,
  the integrations' worker loops): exponential from :data:`BACKOFF_MIN` to
  :data:`BACKOFF_MAX`, reset after a success.
- :class:`ConflictBackoff`: an ID allocation the server refused because of a
  conflict (a script raised ``CLOCK`` or ``IDCONFLICT`` before writing
  anything): at once for ``CLOCK``, else exponential from 1 ms, each sleep at
  most :data:`CONFLICT_MAX_SLEEP`, for at most :data:`CONFLICT_BUDGET_SECONDS`.

Transport errors are never retried by these loops: a lost reply may hide a
committed write (see :mod:`.runner`).
"""

from __future__ import annotations

import time
from typing import Final

from .errors import ScriptConflict

#: Reconnect backoff bounds, in seconds. The longest bounds how late a loop
#: notices that the server is back (a worker resumes within it of a heal);
#: at one connection attempt per loop every 2 s, an outage costs the server
#: little.
BACKOFF_MIN: Final[float] = 0.1
BACKOFF_MAX: Final[float] = 2.0

#: Total time an ID allocation may keep meeting conflicts before failing.
CONFLICT_BUDGET_SECONDS: Final[float] = 30.0

#: First and longest single sleep between conflicting attempts.
CONFLICT_FIRST_SLEEP: Final[float] = 0.001
CONFLICT_MAX_SLEEP: Final[float] = 0.25


class Backoff:
    """Exponential reconnect delays between :data:`BACKOFF_MIN` and :data:`BACKOFF_MAX`."""

    __slots__ = ("delay",)

    def __init__(self) -> None:
        self.delay = BACKOFF_MIN

    def next(self) -> float:
        """Return the delay to sleep now, and double the next one (capped)."""
        delay = self.delay
        self.delay = min(delay * 2, BACKOFF_MAX)
        return delay

    def reset(self) -> None:
        """Start again from the shortest delay (after a success)."""
        self.delay = BACKOFF_MIN


class ConflictBackoff:
    """The waits of one ID allocation that keeps meeting conflicts.

    ``after(conflict)`` returns how long to wait before the next attempt (0
    for a ``CLOCK`` conflict: the caller's generator waits for its clock), or
    raises ``RuntimeError`` once the budget is spent. :meth:`stopped` builds
    the same error for a caller whose stop event interrupted the wait.
    """

    __slots__ = ("conflicts", "_deadline", "_sleep", "_where")

    def __init__(self, where: str) -> None:
        self._where = where
        self._deadline = time.monotonic() + CONFLICT_BUDGET_SECONDS
        self._sleep = CONFLICT_FIRST_SLEEP
        self.conflicts = 0

    def after(self, conflict: ScriptConflict) -> float:
        """Count ``conflict``; return the seconds to wait before trying again."""
        self.conflicts += 1
        if time.monotonic() >= self._deadline:
            raise self.stopped(conflict)
        if conflict.code == "CLOCK":
            return 0.0
        sleep = self._sleep
        self._sleep = min(sleep * 2, CONFLICT_MAX_SLEEP)
        return sleep

    def stopped(self, conflict: ScriptConflict) -> RuntimeError:
        """Return the error that ends the allocation (chained to ``conflict``)."""
        error = RuntimeError(
            f"Failed to allocate a message ID after {self.conflicts} conflicting "
            f"attempts in {self._where}; the durable high-water mark or stored IDs "
            "keep colliding"
        )
        error.__cause__ = conflict
        return error

    @staticmethod
    def observed(conflict: ScriptConflict) -> int:
        """Return the committed ID the conflict reports (the caller raises its cache to it)."""
        return int(conflict.detail.split()[0])
