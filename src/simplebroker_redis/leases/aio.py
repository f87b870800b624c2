"""``AsyncLeases``: the reservation API on an asyncio runner."""

from __future__ import annotations

import dataclasses
from typing import TypeVar

from ..calls import Call
from ..runner.aio import AsyncRedisRunner
from .sync import LeaseCalls

R = TypeVar("R")


class AsyncLeases(LeaseCalls):
    """Asyncio twin of :class:`~simplebroker_redis.Leases`: the same calls, awaited.

    Every operation of :class:`~simplebroker_redis.leases.LeaseCalls` returns
    its call bound to this runner, so ``await leases.ack(token)`` runs it
    (one round trip) and returns the reply, exactly as ``Leases.ack`` does.
    """

    def __init__(self, runner: AsyncRedisRunner) -> None:
        super().__init__(runner.keys)
        self.runner = runner

    def bind(self, call: Call[R]) -> Call[R]:
        """Return ``call`` bound to this API's asyncio runner (awaitable)."""
        return dataclasses.replace(call, runner=self.runner)
