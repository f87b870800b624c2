"""``Leases``: the reservation operations on a :class:`~simplebroker_redis.RedisRunner`.

Each method runs its builder of :mod:`simplebroker_redis.calls` (one round
trip) and returns the reply; the arguments are the builder's.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .. import calls
from ..calls.journal import JOURNAL_START
from ..runner import RedisRunner
from ..types import (
    DeadLetterAck,
    DeadLetterPage,
    Lease,
    MultiLease,
    Recovery,
    Renewal,
    Settlement,
    SettleMode,
    ValueWrite,
)


class Leases:
    """Synchronous reservation API: one line per operation, each a call of :mod:`..calls`."""

    def __init__(self, runner: RedisRunner) -> None:
        self.runner = runner
        self.keys = runner.keys
        runner.ensure_initialized()

    def reserve(
        self,
        queue: str,
        limit: int,
        lease_seconds: float | None,
        *,
        max_deliveries: int | None = None,
        dead_letter: str | None = None,
        target: str = "",
        after: int | None = None,
        before: int | None = None,
        exact: int | None = None,
        order: str = "oldest",
        maintenance: str = "",
        holder: str | None = None,
    ) -> Lease:
        """Reserve up to ``limit`` pending messages of ``queue`` (:func:`~..calls.reserve`)."""
        return self.runner.run(
            calls.reserve(
                queue,
                limit,
                lease_seconds,
                max_deliveries=max_deliveries,
                dead_letter=dead_letter,
                target=target,
                after=after,
                before=before,
                exact=exact,
                order=order,
                maintenance=maintenance,
                holder=holder,
            )
        )

    def reserve_queues(
        self,
        sources: Sequence[tuple[str, str | None]],
        limit: int,
        lease_seconds: float | None,
        *,
        max_deliveries: int | None = None,
        holder: str | None = None,
    ) -> MultiLease:
        """Reserve from several queues in strict order (:func:`~..calls.reserve_queues`)."""
        return self.runner.run(
            calls.reserve_queues(
                sources, limit, lease_seconds, max_deliveries=max_deliveries, holder=holder
            )
        )

    def ack(
        self, token: str, ids: Iterable[int] | None = None, *, delete: bool = False
    ) -> Settlement:
        """Consume ``ids`` of a token (all when None): claimed or deleted (``calls.ack``)."""
        return self.runner.run(calls.ack(token, ids, delete=delete))

    def reject(self, token: str, ids: Iterable[int] | None, queue: str) -> Settlement:
        """Move ``ids`` of a token (all when None) to ``queue`` (:func:`~..calls.reject`)."""
        return self.runner.run(calls.reject(token, ids, queue))

    def commit(self, token: str, mode: SettleMode = "claim") -> Settlement:
        """Settle every ID of a token with ``mode`` ('move' uses its reserve target)."""
        return self.runner.run(calls.settle(token, mode))

    def release(
        self,
        token: str,
        ids: Iterable[int] | None = None,
        *,
        delay_seconds: float = 0.0,
        undeliver: bool = False,
    ) -> int:
        """Make ``ids`` of a token (all when None) pending again (:func:`~..calls.release`)."""
        return self.runner.run(
            calls.release(token, ids, delay_seconds=delay_seconds, undeliver=undeliver)
        )

    def renew(self, tokens: Iterable[str], lease_seconds: float | None = None) -> set[str]:
        """Extend the leases of ``tokens``; return those gone (:func:`~..calls.renew`)."""
        return self.runner.run(calls.renew(tokens, lease_seconds))

    def renewal(self, tokens: Iterable[str], lease_seconds: float | None = None) -> Renewal:
        """:meth:`renew`, with the server's time (:func:`~..calls.renewal`)."""
        return self.runner.run(calls.renewal(tokens, lease_seconds))

    def recover(
        self, queue: str | None = None, *, max_tokens: int = 256, spare: Iterable[str] = ()
    ) -> Recovery:
        """Release expired reservations (:func:`~..calls.recover`)."""
        return self.runner.run(calls.recover(queue, max_tokens=max_tokens, spare=spare))

    def dead_letters(
        self, queues: Iterable[str], *, after: str = JOURNAL_START, limit: int = 256
    ) -> DeadLetterPage:
        """Read the dead-letter journal after ``after`` (:func:`~..calls.dead_letters`)."""
        return self.runner.run(calls.dead_letters(queues, after=after, limit=limit))

    def dead_letter_ack(self, entry: str, value: ValueWrite | None = None) -> DeadLetterAck:
        """Take ``entry`` out of the journal (:func:`~..calls.dead_letter_ack`)."""
        return self.runner.run(calls.dead_letter_ack(entry, value))

    def deliveries(self, message_id: int) -> int:
        """Return how many times ``message_id`` has been reserved (:func:`~..calls.deliveries`)."""
        return self.runner.run(calls.deliveries(self.keys, message_id))
