"""``AsyncLeases``: the asyncio twin of :class:`~.sync.Leases`, on an asyncio runner.

Each coroutine awaits its builder of :mod:`simplebroker_redis.calls` (one round
trip) and returns the reply; the arguments are the builder's.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .. import calls
from ..calls.journal import JOURNAL_START
from ..runner.aio import AsyncRedisRunner
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


class AsyncLeases:
    """Asyncio reservation API: one line per operation, each a call of :mod:`..calls`, awaited.

    Unlike :class:`~.sync.Leases` it makes no round trip when made: the
    runner initializes a namespace it finds uninitialized, then retries.
    """

    def __init__(self, runner: AsyncRedisRunner) -> None:
        self.runner = runner
        self.keys = runner.keys

    async def reserve(
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
        return await self.runner.run(
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

    async def reserve_queues(
        self,
        sources: Sequence[tuple[str, str | None]],
        limit: int,
        lease_seconds: float | None,
        *,
        max_deliveries: int | None = None,
        holder: str | None = None,
    ) -> MultiLease:
        """Reserve from several queues in strict order (:func:`~..calls.reserve_queues`)."""
        return await self.runner.run(
            calls.reserve_queues(
                sources, limit, lease_seconds, max_deliveries=max_deliveries, holder=holder
            )
        )

    async def ack(
        self, token: str, ids: Iterable[int] | None = None, *, delete: bool = False
    ) -> Settlement:
        """Consume ``ids`` of a token (all when None): claimed or deleted (``calls.ack``)."""
        return await self.runner.run(calls.ack(token, ids, delete=delete))

    async def reject(self, token: str, ids: Iterable[int] | None, queue: str) -> Settlement:
        """Move ``ids`` of a token (all when None) to ``queue`` (:func:`~..calls.reject`)."""
        return await self.runner.run(calls.reject(token, ids, queue))

    async def commit(self, token: str, mode: SettleMode = "claim") -> Settlement:
        """Settle every ID of a token with ``mode`` ('move' uses its reserve target)."""
        return await self.runner.run(calls.settle(token, mode))

    async def release(
        self,
        token: str,
        ids: Iterable[int] | None = None,
        *,
        delay_seconds: float = 0.0,
        undeliver: bool = False,
    ) -> int:
        """Make ``ids`` of a token (all when None) pending again (:func:`~..calls.release`)."""
        return await self.runner.run(
            calls.release(token, ids, delay_seconds=delay_seconds, undeliver=undeliver)
        )

    async def renew(self, tokens: Iterable[str], lease_seconds: float | None = None) -> set[str]:
        """Extend the leases of ``tokens``; return those gone (:func:`~..calls.renew`)."""
        return await self.runner.run(calls.renew(tokens, lease_seconds))

    async def renewal(self, tokens: Iterable[str], lease_seconds: float | None = None) -> Renewal:
        """:meth:`renew`, with the server's time (:func:`~..calls.renewal`)."""
        return await self.runner.run(calls.renewal(tokens, lease_seconds))

    async def recover(
        self, queue: str | None = None, *, max_tokens: int = 256, spare: Iterable[str] = ()
    ) -> Recovery:
        """Release expired reservations (:func:`~..calls.recover`)."""
        return await self.runner.run(calls.recover(queue, max_tokens=max_tokens, spare=spare))

    async def dead_letters(
        self, queues: Iterable[str], *, after: str = JOURNAL_START, limit: int = 256
    ) -> DeadLetterPage:
        """Read the dead-letter journal after ``after`` (:func:`~..calls.dead_letters`)."""
        return await self.runner.run(calls.dead_letters(queues, after=after, limit=limit))

    async def dead_letter_ack(self, entry: str, value: ValueWrite | None = None) -> DeadLetterAck:
        """Take ``entry`` out of the journal (:func:`~..calls.dead_letter_ack`)."""
        return await self.runner.run(calls.dead_letter_ack(entry, value))

    async def deliveries(self, message_id: int) -> int:
        """Return how many times ``message_id`` has been reserved (:func:`~..calls.deliveries`)."""
        return await self.runner.run(calls.deliveries(self.keys, message_id))
