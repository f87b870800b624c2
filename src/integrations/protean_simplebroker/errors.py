"""The provider's own errors."""

from __future__ import annotations

import redis

from simplebroker_redis import OutcomeUnknown, ReplicationTimeout


class UnconfirmedPublish(ReplicationTimeout):
    """A publish was stored on the primary, but no replica confirmed it in time.

    Raised with ``WAIT_REPLICAS`` (or ``WAIT_AOF``) when the confirmation
    the broker asked for did not come within ``WAIT_TIMEOUT``: the message
    is in the stream's log on the primary, and its consumers may already
    have it, but a failover before it reaches a replica loses it. Publish
    it again to make sure: a publish is idempotent by the message's ID
    (``metadata.headers.id``) for ``DEDUPE_SECONDS``, so a retry stores no
    second copy, and it waits for the replicas again. A message without an
    ID (a hand-made dict, a DLQ replay) is not deduplicated: published
    again, it may be delivered twice.

    A :class:`simplebroker_redis.ReplicationTimeout` (an ``OperationalError``
    of SimpleBroker, not retryable as such): ``identifier`` is the
    message's identifier on the primary (what ``publish`` would have
    returned), ``stream`` the stream it was published to.
    """

    def __init__(self, stream: str, identifier: str) -> None:
        # Worded without "timeout", "connection"...: Protean's publish would
        # take it for a connection error and publish once more on its own.
        # The backend's ReplicationTimeout (the shortfall) is its __cause__.
        super().__init__(
            f"message {identifier} was stored in stream {stream!r} on the primary, but not "
            "confirmed by a replica in time: whether it survives a failover is unknown; "
            "publish it again (idempotent by its message ID) to make sure",
            result=identifier,
        )
        self.stream = stream
        self.identifier = identifier


def worth_a_retry(exc: Exception) -> bool:
    """Return False for a publish whose reply timed out: Protean's publish must not retry it.

    Protean's ``publish`` PINGs and tries once more after a connection
    error. After a timeout both would wait as long again (issue 42: a
    publish in a blackhole took 20 s, or returned only at the heal), so it
    raises ``OutcomeUnknown`` at once; publishing the same message again
    stores it at most once (its ID).
    """
    return not (isinstance(exc, OutcomeUnknown) and isinstance(exc.__cause__, redis.TimeoutError))
