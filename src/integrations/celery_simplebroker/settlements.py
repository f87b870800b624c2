"""Settling delivered messages: acknowledge, hand back, dead-letter; later if need be.

Celery acknowledges a task (``message.ack()``) once, from its event loop,
and when that raises a connection error it logs "Couldn't ack" and goes
on: it never acknowledges the message again, and kombu keeps its delivery
tag among the unacknowledged ones, so the prefetch window lost a slot for
good. After a reset of every connection a worker lost all of them that
way, and took nothing more while its heartbeat and wake-ups were back
(issue 42).

So the channel always frees the slot (``QoS.ack``), and the :class:`Settler`
does not raise when the server cannot be reached: it keeps the settlement
(:class:`Deferred`), and the heartbeat sends it again after its renewals
until the server answers (:meth:`Deferred.retry`). Meanwhile the message's
token stays held (``Holdings.settling``): renewed, spared by this process's
recovery, and not reported lost when the acknowledgement's landing makes it
go. A settlement the server then reports lost was made by an earlier try
(whose reply was lost) or its lease expired: either way nothing is left to
do. The deferred settlements are shared by every transport of the process
on the same namespace, so one that a transport closed with (Celery
restarted its consumer) is still sent by the next one's heartbeat.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from simplebroker_redis import Leases, ReplicationTimeout, Settlement
from simplebroker_redis.holdings import Holdings

from .acks import ResultAcks, report
from .errors import unreachable
from .outage import Outage

logger = logging.getLogger("celery_simplebroker")


def _nothing() -> None:
    return None


@dataclass(frozen=True, slots=True)
class Settle:
    """One settlement: what it is, how to send it, and what to do once it is done."""

    token: str
    message_id: int
    what: str  #: "acknowledgement" or "rejection", for the log
    send: Callable[[], Settlement] = field(compare=False)
    #: Called once the settlement landed or failed for good (the token is let go).
    finish: Callable[[], object] = field(compare=False, default=_nothing)


class Deferred:
    """The settlements of one namespace waiting for the server (thread-safe)."""

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
            settle.finish()
        if sent:
            logger.info("%d deferred acknowledgement(s) or rejection(s) sent", sent)


#: The deferred settlements of this process, per namespace (runner identity).
_DEFERRED: dict[object, Deferred] = {}
_DEFERRED_LOCK = threading.Lock()


def deferred_for(identity: object) -> Deferred:
    """Return this process's deferred settlements on the namespace ``identity`` names."""
    with _DEFERRED_LOCK:
        found = _DEFERRED.get(identity)
        if found is None:
            found = _DEFERRED[identity] = Deferred()
        return found


class Settler:
    """Acknowledges, hands back and dead-letters the messages of one transport."""

    def __init__(
        self,
        leases: Callable[[], Leases],
        holdings: Holdings,
        acks: ResultAcks,
        outage: Outage,
        deferred: Deferred,
    ) -> None:
        self._leases = leases
        self.holdings = holdings
        self.acks = acks
        self.outage = outage
        self.deferred = deferred

    def ack(self, token: str, message_id: int) -> None:
        """Delete one reserved message (one round trip; none when its result did it).

        The token stays held (renewed) until the server confirmed it, so a
        renewal racing with this call does not report it lost.
        """
        confirmed = self.acks.take(token, message_id)
        if confirmed:
            return
        finish: Callable[[], object] = _nothing
        if confirmed is None:  # the result's script did not let it go already
            self.holdings.settling(token)
            finish = functools.partial(self.holdings.settled, token)
        send = functools.partial(self._leases().ack, token, [message_id], delete=True)
        try:
            settlement = self._settle(Settle(token, message_id, "acknowledgement", send, finish))
        except ReplicationTimeout as exc:
            # Celery would log a failed acknowledgement as critical; it happened.
            logger.warning("message %d acknowledged, not confirmed: %s", message_id, exc)
            settlement = exc.result
        if settlement is not None:
            report(settlement, message_id)

    def dead_letter(self, token: str, message_id: int, target: str) -> None:
        """Move a rejected message to the queue ``target`` (storage name)."""
        left, unheld = self.acks.unsettled(token, [message_id])
        if not left:
            return  # its result's script deleted it already
        finish: Callable[[], object] = _nothing
        if not unheld:
            self.holdings.settling(token)
            finish = functools.partial(self.holdings.settled, token)
        send = functools.partial(self._leases().reject, token, [message_id], target)
        try:
            self._settle(Settle(token, message_id, "rejection", send, finish))
        except ReplicationTimeout as exc:  # moved on the primary, as for ack
            logger.warning("message %d moved to %s, not confirmed: %s", message_id, target, exc)

    def release(self, groups: Mapping[str, Iterable[int]], *, undeliver: bool) -> None:
        """Make reserved messages pending again at once, atomically per reservation.

        ``undeliver``: they were never handed to Celery, so the delivery
        does not count (and they are not marked redelivered). One that
        cannot reach the server comes back when its lease expires.
        """
        for token, ids in groups.items():
            id_list, unheld = self.acks.unsettled(token, list(ids))
            if not id_list:
                continue
            if len(id_list) > unheld:  # before the server drops the token
                self.holdings.let_go(token, len(id_list) - unheld)
            if self.outage.down:
                logger.info(
                    "%d message(s) not handed back (the server cannot be reached); they "
                    "return when their lease expires",
                    len(id_list),
                )
                continue
            try:
                self._leases().release(token, id_list, undeliver=undeliver)
            except ReplicationTimeout:
                pass  # done on the primary, not confirmed by a replica yet
            except Exception as exc:  # noqa: BLE001 - the lease expires and brings them back
                logger.warning(
                    "could not hand back %d message(s) (%s); they return when their lease expires",
                    len(id_list),
                    exc,
                )

    def _settle(self, settle: Settle) -> Settlement | None:
        """Send a settlement now; during an outage defer it (None), see :mod:`.outage`."""
        if not self.outage.down:
            try:
                settlement = settle.send()
            except Exception as exc:
                if not unreachable(exc):
                    settle.finish()
                    raise
                self.outage.begin(exc)
            else:
                settle.finish()
                return settlement
        self.deferred.defer(settle)
        return None
