"""Acknowledgements and rejections the server could not be told of, sent again later.

Celery acknowledges a task (``message.ack()``) once, from its event loop,
and when that raises a connection error it logs "Couldn't ack" and goes
on: it never acknowledges the message again, and kombu keeps its delivery
tag among the unacknowledged ones, so the prefetch window lost a slot for
good. After a reset of every connection a worker lost all of them that
way, and took nothing more while its heartbeat and wake-ups were back
(issue 42).

So the channel always frees the slot (``QoS.ack``), and the store does
not raise when the server cannot be reached: it records the settlement
here, and the heartbeat sends it again after every renewal until the
server answers (:meth:`Deferred.retry`). The message stays reserved on the
server meanwhile; it comes back to a worker only if its lease expires
first (an outage longer than the lease), which at-least-once delivery
allows. A settlement the server then reports lost was made by the first
try (whose reply was lost) or its lease expired: either way nothing is
left to do.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from simplebroker_redis import Settlement

from .errors import unreachable

logger = logging.getLogger("celery_simplebroker")


@dataclass(frozen=True, slots=True)
class Settle:
    """One settlement to send again: what it is, and how to send it."""

    token: str
    message_id: int
    what: str  #: "acknowledgement" or "rejection", for the log
    send: Callable[[], Settlement] = field(compare=False)


class Deferred:
    """The settlements of one transport waiting for the server (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: dict[tuple[str, int], Settle] = {}

    def __len__(self) -> int:
        with self._lock:
            return len(self._waiting)

    def defer(self, settle: Settle) -> None:
        """Keep ``settle`` to send again (the outage was logged: this is a debug line)."""
        with self._lock:
            self._waiting[(settle.token, settle.message_id)] = settle
        logger.debug("%s of message %d deferred", settle.what, settle.message_id)

    def retry(self) -> None:
        """Send every deferred settlement again (the heartbeat thread, after a renewal).

        Stops at the first that still cannot reach the server; one that
        fails for any other reason is logged and dropped (its lease brings
        the message back).
        """
        with self._lock:
            waiting = list(self._waiting.values())
        sent = 0
        for settle in waiting:
            try:
                outcome = settle.send()
            except Exception as exc:  # noqa: BLE001 - the heartbeat must outlive it
                if unreachable(exc):
                    break
                logger.error(
                    "%s of message %d failed (%s); the message comes back when its lease expires",
                    settle.what,
                    settle.message_id,
                    exc,
                )
            else:
                sent += 1
                if outcome.lost:
                    logger.debug(
                        "deferred %s of message %d: done before (its reply was lost) or its "
                        "lease expired",
                        settle.what,
                        settle.message_id,
                    )
            with self._lock:
                self._waiting.pop((settle.token, settle.message_id), None)
        if sent:
            logger.info("%d deferred acknowledgement(s) or rejection(s) sent", sent)
