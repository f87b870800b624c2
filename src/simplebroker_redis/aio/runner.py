"""``AsyncRedisRunner``: the asyncio runner, one pool per event loop."""

from __future__ import annotations

import asyncio
import os
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import redis.asyncio as aioredis

from ..calls import Call
from ..calls import init as init_call
from ..runner import RedisRunner, RunnerBase, register_scripts
from ..scripts import ScriptName

R = TypeVar("R")


@dataclass(slots=True)
class _LoopClient:
    """The client (and its registered scripts) of one event loop."""

    client: aioredis.Redis
    scripts: dict[ScriptName, Any]
    initialized: bool = False


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
            client = self.connections.async_client()
            here = self._loops[loop] = _LoopClient(client, register_scripts(client))
        return here

    async def run(self, call: Call[R]) -> R:
        """Await ``call`` (one round trip) and return its parsed reply."""
        here = self._here()
        operation, attempt = self._operation(call, here.scripts), self._attempt(call)
        while True:
            with attempt:
                return call.parse(await operation(here.client))
            if attempt.remedy is not None:
                attempt.remedied(await self.run(attempt.remedy))

    async def execute(
        self, operation: Callable[[aioredis.Redis], Awaitable[R]], *, idempotent: bool = False
    ) -> R:
        """Await plain commands ``operation(client)`` under the same failure rule."""
        result: R = await self.run(Call(_same, command=operation, idempotent=idempotent))
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
            await here.client.aclose(close_connection_pool=True)


def _same(value: Any) -> Any:
    return value
