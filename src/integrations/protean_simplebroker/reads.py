"""What one read of a consumer returns: nacked messages first, then reserved ones.

A consumer's read (``read``, ``get_next``, ``read_blocking``) returns the
messages it nacked first (see :mod:`.inflight`), then reserves new ones
from its group. A group a Protean subscription owns gets one message per
read: the subscription starts each message as soon as it gets it, so the
rest of a reservation waits in flight, held and renewed, for the next
reads. Every message is checked against its lease right before it is
returned (``Store.startable``): one whose lease ran out while the process
was stopped, or cut off from the server, is handed back unstarted, and one
another consumer recovered meanwhile is forgotten. Neither reaches a
handler here. A read of an owned group makes that check only once no
other subscription's handler of the process runs (the broker waits with
``InFlight.wait_idle``), so what it returns starts at once, not after a
handler during which the process may have been stopped.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Final

from simplebroker.ext import OperationalError

from .groups import Groups
from .inflight import InFlight, Key, Taken
from .messages import CorruptMessage, open_envelope
from .store import Store

logger = logging.getLogger("protean_simplebroker")

#: Reservations one read makes at most when what it reserved cannot start.
RESERVE_TRIES: Final[int] = 3

#: What a read returns: (Protean identifier, message) pairs.
Taking = list[tuple[str, dict[str, Any]]]


def take(
    store: Store,
    groups: Groups,
    inflight: InFlight,
    stream: str,
    group: str,
    count: int,
    *,
    owned: bool,
) -> Taking:
    """Return up to ``count`` messages of ``group`` on ``stream`` (one when ``owned``)."""
    if count < 1:
        return []
    key = (stream, group)
    want = 1 if owned else count
    out = _startable(store, inflight, key, inflight.take_redeliveries(key, want))
    if len(out) < want:
        out += _startable(store, inflight, key, inflight.take_waiting(key, want - len(out)))
    for _ in range(RESERVE_TRIES):
        if len(out) >= want:
            break
        if not _reserve(store, groups, inflight, key, count - len(out), owned=owned):
            break
        out += _startable(store, inflight, key, inflight.take_waiting(key, want - len(out)))
    if owned:  # its subscription starts it at once: in a handler (see .inflight)
        inflight.handed(key, [identifier for identifier, _ in out])
    return out


def take_when_idle(
    store: Store,
    groups: Groups,
    inflight: InFlight,
    handing: threading.Lock,
    stream: str,
    group: str,
    count: int,
    *,
    owned: bool,
    until: float,
) -> Taking:
    """:func:`take`, but an owned group's read waits until no other handler of the process runs.

    It waits until ``until`` (``time.monotonic()``; the past: no wait) and
    returns nothing past it, so what it returns starts at once and never
    waits in this process, checked but not started, while a stop outlasts
    its lease (see :mod:`.inflight`). ``handing``: one such read at a time
    (two could each pass the wait, and the second's message would wait for
    the first's handler).
    """
    if not owned:
        return take(store, groups, inflight, stream, group, count, owned=False)
    if not handing.acquire(timeout=max(0.0, until - time.monotonic())):
        return []
    try:
        if not inflight.wait_idle((stream, group), until):
            return []
        return take(store, groups, inflight, stream, group, count, owned=True)
    finally:
        handing.release()


def _reserve(
    store: Store, groups: Groups, inflight: InFlight, key: Key, limit: int, *, owned: bool
) -> int:
    """Reserve up to ``limit`` copies as waiting in-flight messages; return how many."""
    stream, group = key
    state = groups.ensure(stream, group)
    store.recover(stream, group)
    groups.pull(state)
    reserved = 0
    for held, body in store.reserve(stream, group, limit, owned=owned):
        try:
            identifier, payload = open_envelope(body)
        except CorruptMessage as exc:
            logger.error(
                "moving unreadable message %s of %s to its dead letters: %s",
                held.copy_id,
                state.queue,
                exc,
            )
            store.bury(held)
            continue
        inflight.add(key, identifier, held, payload, waiting=True)
        reserved += 1
    return reserved


def _startable(
    store: Store, inflight: InFlight, key: Key, taken: list[tuple[str, Taken]]
) -> Taking:
    """Return the messages of ``taken`` whose lease is still this consumer's (module docstring)."""
    out: Taking = []
    expired = lost = 0
    for identifier, entry in taken:
        verdict = store.startable(entry.held)
        if verdict:
            out.append((identifier, entry.payload))
            continue
        inflight.drop(key, identifier)
        if verdict is None:
            lost += 1
            continue
        expired += 1
        try:
            store.release(entry.held, counted=False)
        except (OperationalError, OSError) as exc:  # it returns after its lease
            logger.warning("could not hand back message %s: %s", identifier, exc)
    if expired or lost:
        logger.warning(
            "%d message(s) of %s for group %s not started: %d lease(s) ran out while this "
            "consumer was stopped or cut off from the server (handed back), %d taken over "
            "by another consumer",
            expired + lost,
            key[0],
            key[1],
            expired,
            lost,
        )
    return out
