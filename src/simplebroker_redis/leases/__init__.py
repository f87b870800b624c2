"""Reservations with renewable leases: the at-least-once API for integrations.

A *lease* reserves up to N pending messages of a queue under a fresh token.
Reserved messages stay pending for ``peek`` and stats, but nobody else can
claim, move or delete them until the holder settles them:

- ``ack`` consumes IDs (claimed, or deleted with ``delete=True``),
- ``reject`` moves IDs to another queue (a dead-letter queue),
- ``release`` makes IDs pending again, optionally after a delay,
- ``renew`` extends the leases of many tokens in one round trip,
- ``recover`` releases reservations whose lease expired.

``reserve_queues`` reserves from several queues in one round trip, in strict
order, with one token per queue that gave messages.

A message dead-lettered after ``max_deliveries`` is also recorded in the
namespace's dead-letter journal (a capped stream): ``dead_letters`` reads
its entries after a cursor, ``dead_letter_ack`` takes one out (optionally
storing a value, such as an error result, where none is), and exactly one
of any number of consumers acknowledging one entry is told it did, so it
alone reports it.

Every call is one Lua script (one round trip). Each message carries a
delivery count: how many times it has been reserved. With ``max_deliveries``
a message whose lease expires (or is released) after its last allowed
delivery goes to the ``dead_letter`` queue instead of being redelivered.

There is one way to run an operation: its typed builder in
:mod:`simplebroker_redis.calls` (``calls.reserve``, ``calls.ack``, ...),
run by a runner. :class:`Leases` (:mod:`.sync`, on a
:class:`~simplebroker_redis.RedisRunner`) and its asyncio twin
:class:`AsyncLeases` (:mod:`.aio`) are that, one line per operation, for
callers that hold a runner. SimpleBroker's ``at_least_once`` generators
are the special case whose lease is ``stale_batch_seconds``.
"""

from .aio import AsyncLeases
from .sync import Leases

__all__ = ["AsyncLeases", "Leases"]
