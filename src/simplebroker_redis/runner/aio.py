"""``AsyncRedisRunner``: the asyncio twin of :class:`~.sync.RedisRunner`, one pool per event loop.

Neither runner re-implements a state transition: both run the scripts of
:mod:`simplebroker_redis.calls`. Connections open lazily, per process and
event loop, so a runner made at import time is safe in forked workers.
"""

from __future__ import annotations

import asyncio
import os
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import redis
import redis.asyncio as aioredis

from ..calls import Call
from ..calls import init as init_call
from ..connection import AsyncRoute
from ..errors import translate
from .base import RunnerBase, plain_call
from .durability import WAITAOF_INFO
from .sync import RedisRunner
from .wire import direct_async

R = TypeVar("R")


@dataclass(slots=True)
class _LoopClient:
    """The clients (:class:`~..connection.AsyncRoute`) of one event loop."""

    route: AsyncRoute
    initialized: bool = False
    aof_checked: bool = False


class AsyncRedisRunner(RunnerBase):
    """Asyncio twin of :class:`~simplebroker_redis.RedisRunner` (same arguments).

    A connection belongs to the event loop that opened it, so each loop gets
    its own pool; threads each running their own loop on one runner never
    share sockets, and a forked child starts with none. ``sync`` is a
    :class:`RedisRunner` on the same target and options, for code that must
    not depend on the loop (a heartbeat thread); its pool opens only if used.
    """

    def _init_state(self) -> None:
        self.sync = RedisRunner(self.target, self.options, config=self.config)
        self._pid = os.getpid()
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopClient] = (
            weakref.WeakKeyDictionary()
        )

    def _here(self) -> _LoopClient:
        loop = asyncio.get_running_loop()
        if self._pid != os.getpid():
            self._pid, self._loops = os.getpid(), weakref.WeakKeyDictionary()
        here = self._loops.get(loop)
        if here is None:
            here = self._loops[loop] = _LoopClient(AsyncRoute(self.connections))
        return here

    async def client(self) -> aioredis.Redis:
        """Return the running loop's client of the namespace's primary."""
        try:
            return await self._here().route.primary()
        except redis.RedisError as exc:
            raise translate(exc, self.where) from exc

    async def run(self, call: Call[R]) -> R:
        """Await ``call`` (one round trip) and return its parsed reply."""
        here = self._here()
        route = here.route
        command = None if call.script is None else self._script_command(call)
        operation, attempt = self._operation(call, command), self._attempt(call, route.moved)
        durability = self.durability
        if durability.version_due(call, here.aof_checked):
            durability.check_version(await self.run(WAITAOF_INFO))
            here.aof_checked = True
        waits = durability.wanted(call)
        while True:
            with attempt:
                client = await route.primary() if attempt.ask is None else route.node(attempt.ask)
                if attempt.ask is None and not waits:
                    if command is not None:
                        return call.parse(await direct_async(client, command))
                    return call.parse(await operation(client))
                pipe, index = durability.pipeline(client, operation, call, attempt.ask is not None)
                replies = await pipe.execute(raise_on_error=False)
                return durability.acknowledged(replies, index, call.parse)
            if attempt.pause:
                await asyncio.sleep(attempt.pause)
            if attempt.remedy is not None:
                remedy = attempt.remedy
                if attempt.ask is not None and remedy.command is not None:
                    try:  # load the scripts where ASK sent the try
                        reply = remedy.parse(await remedy.command(route.node(attempt.ask)))
                    except redis.RedisError as exc:
                        raise translate(exc, self.where) from exc
                    attempt.remedied(reply)
                else:
                    attempt.remedied(await self.run(remedy))

    async def execute(
        self,
        operation: Callable[[aioredis.Redis], Awaitable[R]],
        *,
        idempotent: bool = False,
        writes: bool = False,
    ) -> R:
        """Await plain commands ``operation(client)``, as :meth:`RedisRunner.execute` runs them."""
        result: R = await self.run(plain_call(operation, idempotent=idempotent, writes=writes))
        return result

    async def ensure_initialized(self) -> None:
        """Create or validate the namespace once per process and event loop."""
        here = self._here()
        if not here.initialized:
            await self.run(init_call("init"))
            here.initialized = True

    async def aclose(self) -> None:
        """Close the running loop's pool (reopened on next use)."""
        here = self._loops.pop(asyncio.get_running_loop(), None)
        if here is not None and self._pid == os.getpid():
            await here.route.aclose()
