"""The outage policy of a wake-up subscription, the same for threads and asyncio.

A subscription (the sync :class:`~.listener.WakeupListener` or the asyncio
:class:`~simplebroker_redis.activity.AsyncActivity`) that loses its connection,
or whose slot moved, is in an *outage* until a new subscription has lasted
:data:`STABLE_AFTER` seconds. :class:`Outage` decides everything that does
not depend on how the subscriber reads its socket: where to reconnect (a
``MOVED`` answer names the new owner; otherwise a cluster asks its seed
nodes again), how long to wait (:class:`~simplebroker_redis.retry.Backoff`,
0.1 s to 2 s), and what to log (one warning when an outage begins, one
line when the subscription is back). Each subscriber only sleeps for the
delay it is given, in its own way.
"""

from __future__ import annotations

import logging
from typing import Final

import redis
import redis.exceptions as rx

from ..connection import Connections
from ..retry import Backoff

#: Seconds of silence on a subscription before it is checked with a PING.
PING_INTERVAL: Final[float] = 5.0

#: Seconds a PING on a subscription may go unanswered before the connection
#: counts as lost. A subscribed socket has no read timeout (it idles
#: between wake-ups), so without this a network that went silent (a
#: blackhole, a NAT that forgot the flow: no RST ever arrives) would leave
#: a worker deaf until TCP gave up, minutes later. With it the subscriber
#: notices within ``PING_INTERVAL + PING_TIMEOUT`` seconds (8), shorter
#: than the default 10 s lease, and reconnects.
PING_TIMEOUT: Final[float] = 3.0

#: Seconds a new subscriber waits for its first subscription before going on
#: without it (an unreachable server only delays it; the subscriber keeps
#: reconnecting and wakes its waiters once it is subscribed).
SUBSCRIBE_WAIT: Final[float] = 5.0

#: Seconds a subscription must last to end an outage. A failover can let a
#: reconnect succeed to the demoted node, which then drops it again: that is
#: the same outage (one warning), and the next reconnect backs off.
STABLE_AFTER: Final[float] = 2.0

logger = logging.getLogger("simplebroker_redis")


class SlotMoved(redis.ConnectionError):
    """The server ended a subscription we still want: the namespace's slot moved."""

    def __init__(self, channel: str) -> None:
        super().__init__(f"the server ended the subscription of {channel}")


class Unanswered(redis.ConnectionError):
    """A PING on the subscription went unanswered for ``PING_TIMEOUT`` seconds."""

    def __init__(self) -> None:
        super().__init__(f"no answer to a PING within {PING_TIMEOUT:g} s (half-open connection?)")


class Outage:
    """Reconnect delays, re-routing and logging of one subscriber's outages.

    Not thread-safe: each subscriber has its own, used by the one thread or
    task that (re)connects.
    """

    __slots__ = ("_backoff", "_connections", "_restored", "_where", "failing")

    def __init__(self, connections: Connections, where: str) -> None:
        self._connections = connections
        self._where = where
        self._backoff = Backoff()
        self.failing = False  #: an outage is under way (its warning was logged)
        self._restored = False  # the outage's "restored" line was logged

    def subscribed(self) -> None:
        """Note a working subscription; the first one of an outage is logged."""
        if self.failing and not self._restored:
            logger.info("wake-up subscription at %s restored", self._where)
            self._restored = True

    def lost(self, exc: BaseException, lasted: float | None) -> float:
        """Account for a failed or lost subscription; return the seconds to wait.

        ``lasted``: how long the subscription had worked (None: it never
        did). One that lasted :data:`STABLE_AFTER` ended the outage before,
        so this starts a new one: warned about, and retried quickly.
        """
        if lasted is not None and lasted >= STABLE_AFTER:
            self.failing = self._restored = False
            self._backoff.reset()
        if isinstance(exc, rx.MovedError):
            self._connections.moved((str(exc.host), int(exc.port)))
        elif self._connections.kind == "cluster":
            self._connections.moved(None)  # ask the seed nodes where the slot is now
        if not self.failing:
            kind = "lost" if isinstance(exc, (redis.RedisError, OSError)) else "failed"
            # type and text: redis-py 8's repr of its errors drops the text
            logger.warning(
                "wake-up subscription at %s %s: %s: %s; reconnecting",
                self._where,
                kind,
                type(exc).__name__,
                exc,
            )
        self.failing = True
        return self._backoff.next()
