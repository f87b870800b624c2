"""A transport's outages: consuming pauses while the server cannot be reached, then resumes.

A worker's event loop reserves, acknowledges and rejects messages with
round trips of its own. When one of them finds the server unreachable
(refused, reset, timed out), raising to Celery would restart its consumer:
Celery hands back every unacknowledged message (tasks still running in
the pool included, which then run twice) and reconnects on its own
schedule, 2 s, then 4 s, ... up to 30 s apart, so a worker could stay idle
for half a minute after the server came back. Swallowed instead, a failed
acknowledgement used to leave the worker consuming nothing at all (issue
42).

So the transport rides the outage out itself. The first failure opens an
:class:`Outage` (one warning); while it lasts the event loop makes no
round trip for the transport: a poll delivers nothing, an acknowledgement
is deferred (:mod:`.settlements`). The lease heartbeat keeps trying the
server every half second from its own thread; its first renewal that gets
through ends the outage (one line), sends the deferred settlements and
wakes the loop, which polls at once. A worker so resumes consuming within
a heartbeat retry of the server's return, however the outage ended, and
Celery's consumer never restarts for it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

logger = logging.getLogger("celery_simplebroker")


class Outage:
    """Whether the server is known unreachable (thread-safe); logs each outage once."""

    def __init__(self, where: str) -> None:
        self._where = where
        self._lock = threading.Lock()
        self._down = False
        self.count = 0  #: outages so far (observability, tests)
        #: Called (heartbeat thread) when an outage ends: the poller polls again.
        self.on_end: Callable[[], None] | None = None

    @property
    def down(self) -> bool:
        """Return True while an outage lasts (no round trip is worth making)."""
        return self._down

    def begin(self, exc: BaseException) -> None:
        """Record that a round trip found the server unreachable."""
        with self._lock:
            if self._down:
                return
            self._down = True
            self.count += 1
        logger.warning(
            "%s cannot be reached (%s): this worker takes no message and defers its "
            "acknowledgements until the lease heartbeat reaches it again",
            self._where,
            exc,
        )

    def end(self) -> None:
        """Record that the server answered (the heartbeat renewed); wake the poller."""
        with self._lock:
            if not self._down:
                return
            self._down = False
        logger.info("%s answers again: consuming resumes", self._where)
        if self.on_end is not None:
            self.on_end()
