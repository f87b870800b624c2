"""Acknowledgements made by the script that stores a task's result.

With ``acks_late`` in a solo, threads, gevent or eventlet worker, the
process that stores a succeeded task's result also holds the task's
message. The result backend then deletes the message in the same script
(``celery_store.lua``), and Celery's own acknowledgement that follows costs
nothing. This module is what the result backend and the transport share
for that, so neither imports the other:

- :class:`ResultAcks`, one per transport: which held messages a result's
  script is acknowledging (the heartbeat stops renewing them first) and
  whether the server confirmed it; the transport's store consults it before
  its own acknowledgement, release or rejection of a message;
- :func:`holder_of`: the transport of this process holding a reservation;
- :class:`Ahead`: a reservation the same script can make for the worker's
  next tasks (planned by the transport's poller, see :class:`Prefetcher`).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from simplebroker_redis import Settlement
from simplebroker_redis.heartbeat import Holdings
from simplebroker_redis.types import MultiLease

from .envelope import Tag

logger = logging.getLogger("celery_simplebroker")

Identity = tuple[object, ...]  #: ``RedisRunner.identity``: server, credentials, namespace


@dataclass(frozen=True, slots=True)
class Reservation:
    """What a reservation of one queue asks for (``reserve_queues`` and ``celery_store``)."""

    sources: list[tuple[str, str | None]]  #: (storage queue, dead-letter queue) in read order
    limit: int
    lease_seconds: float
    max_deliveries: int | None
    #: The reserving worker (``Holdings.holder``): its own reservations are spared.
    holder: str | None = None


@dataclass(frozen=True, slots=True)
class Ahead:
    """A reservation a result's script makes for the worker (see :meth:`Prefetcher.ahead`)."""

    reservation: Reservation
    #: Buffers what the script reserved for the worker's loop (or hands it back).
    deliver: Callable[[MultiLease], None]


class Prefetcher(Protocol):
    """What plans and undoes the reservations a result's script makes (the poller)."""

    def ahead(self, acked: Tag) -> Ahead | None:
        """Return the reservation to make with ``acked``'s result, or None."""

    def hand_back_unconfirmed(self, reserved: object) -> None:
        """Hand back a reservation no replica confirmed, its delivery not counted."""


def report(settlement: Settlement, message_id: int) -> None:
    """Warn when an acknowledgement came after the message's lease had expired."""
    if settlement.lost:
        logger.warning(
            "message %d was acknowledged after its lease expired; it may have run twice",
            message_id,
        )


class ResultAcks:
    """One transport's messages acknowledged together with their task's result.

    Each entry is False while the result's script runs, True once the
    server confirmed it deleted the message.
    """

    def __init__(self, identity: Identity, holdings: Holdings) -> None:
        self.identity = identity
        self.holdings = holdings
        self.pid = os.getpid()
        self.prefetcher: Prefetcher | None = None  #: set by the transport
        self._entries: dict[Tag, bool] = {}
        self._lock = threading.Lock()

    # -- the result backend's side ------------------------------------------------------
    def begin(self, token: str, message_id: int) -> bool:
        """Start acknowledging a held message in the script that stores its result.

        Returns False when this transport does not hold it. Otherwise the
        heartbeat stops renewing it, and the caller reports the script's
        outcome to :meth:`confirmed`; Celery's own acknowledgement then
        costs nothing, or, when the script did not confirm it, is sent as
        usual.
        """
        key = (token, message_id)
        with self._lock:
            if key in self._entries:
                return not self._entries[key]  # a retried store carries it again
            if not self.holdings.holds(token):
                return False
            self._entries[key] = False
        self.holdings.let_go(token)
        return True

    def confirmed(self, token: str, message_id: int, settlement: Settlement) -> None:
        """Record that the result's script deleted the message (``settlement`` from it)."""
        with self._lock:
            if (token, message_id) in self._entries:
                self._entries[(token, message_id)] = True
        report(settlement, message_id)

    def ahead(self, acked: Tag) -> Ahead | None:
        """Return the reservation the result's script may make for this worker, or None."""
        return None if self.prefetcher is None else self.prefetcher.ahead(acked)

    def hand_back_unconfirmed(self, reserved: object) -> None:
        """Hand back what a result's script reserved when no replica confirmed it."""
        if self.prefetcher is not None:
            self.prefetcher.hand_back_unconfirmed(reserved)

    # -- the transport's side ------------------------------------------------------------
    def settled(self, message: Tag) -> bool:
        """Return True when the script storing its task's result deleted ``message``."""
        with self._lock:
            return self._entries.get(message, False)

    def take(self, token: str, message_id: int) -> bool | None:
        """Forget ``message`` before its acknowledgement; return its entry (None: no entry)."""
        with self._lock:
            return self._entries.pop((token, message_id), None)

    def unsettled(self, token: str, ids: list[int]) -> tuple[list[int], int]:
        """Split ``ids`` for a release or reject: (still on the server, already unheld).

        Drops messages whose result's script deleted them already; counts
        those the heartbeat stopped renewing for an unconfirmed one.
        """
        left, unheld = [], 0
        with self._lock:
            for message_id in ids:
                confirmed = self._entries.pop((token, message_id), None)
                if not confirmed:
                    left.append(message_id)
                    unheld += confirmed is False
        return left, unheld


#: This process's transports that reserved messages and are not closed: the
#: result backend finds a task's holder among them.
_HOLDERS: set[ResultAcks] = set()


def hold(acks: ResultAcks) -> None:
    """Make ``acks``'s transport findable by :func:`holder_of` (it reserved messages)."""
    _HOLDERS.add(acks)


def release(acks: ResultAcks) -> None:
    """Stop finding ``acks``'s transport (it closed)."""
    _HOLDERS.discard(acks)


def holder_of(token: str, identity: object) -> ResultAcks | None:
    """Return the registry of this process's transport holding reservation ``token``.

    None when no transport of this process (a forked pool child inherits its
    parent's, which it does not hold) holds it on target ``identity``.
    """
    pid = os.getpid()
    for acks in tuple(_HOLDERS):
        if acks.pid == pid and acks.identity == identity and acks.holdings.holds(token):
            return acks
    return None
