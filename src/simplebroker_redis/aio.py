"""The reservation API on an asyncio client, for async integrations (Taskiq).

:class:`AsyncRedisRunner` mirrors :class:`~simplebroker_redis.RedisRunner`
(same target, options, keys, scripts and error translation) on
``redis.asyncio``. :class:`AsyncLeases` runs the very same Lua scripts as
:class:`~simplebroker_redis.Leases`; neither side re-implements a state
transition. :class:`AsyncActivity` bridges the process's Pub/Sub listener
thread into asyncio.

Connections open lazily, per process and event loop, so a broker object made
at import time is safe to use in forked worker processes.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import redis
import redis.asyncio as aioredis
from simplebroker import resolve_config
from simplebroker.ext import DatabaseError, TimestampError

from .activity import listener_for
from .errors import ScriptConflict, translate
from .keys import format_id
from .leases import (
    Lease,
    Recovery,
    Settlement,
    SettleMode,
    new_token,
    parse_recovery,
    parse_reserve,
    recover_args,
    release_args,
    renew_args,
    reserve_args,
    settle_args,
)
from .runner import RedisRunner
from .scripts import ScriptName, Scripts
from .validation import validate_message, validate_queue_name

T = TypeVar("T")


class AsyncRedisRunner:
    """Asyncio twin of :class:`RedisRunner` (same arguments)."""

    def __init__(
        self,
        target: str,
        *,
        namespace: str = "simplebroker_redis_v1",
        max_connections: int = 50,
        pool_timeout: float | None = None,
        stale_batch_seconds: float = 300.0,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        # The sync runner parses and holds the settings; its pool opens only
        # if the sync side is used (the Pub/Sub listener reads its settings).
        self.sync = RedisRunner(
            target,
            namespace=namespace,
            max_connections=max_connections,
            pool_timeout=pool_timeout,
            stale_batch_seconds=stale_batch_seconds,
            config=config,
        )
        self.keys = self.sync.keys
        self.where = self.sync.where
        self._owner: tuple[int, asyncio.AbstractEventLoop] | None = None
        self._client: aioredis.Redis | None = None
        self._scripts: Scripts | None = None
        self._initialized = False

    def _ensure_client(self) -> tuple[aioredis.Redis, Scripts]:
        owner = (os.getpid(), asyncio.get_running_loop())
        if self._owner != owner or self._client is None or self._scripts is None:
            pool = aioredis.BlockingConnectionPool.from_url(
                self.sync.target,
                max_connections=self.sync.options.max_connections,
                timeout=self.sync.pool_timeout,
                **self.sync.connection_kwargs(),
            )
            self._client = aioredis.Redis(connection_pool=pool)
            self._scripts = Scripts.register(self._client)
            self._owner = owner
            self._initialized = False
        return self._client, self._scripts

    async def execute(
        self, operation: Callable[[aioredis.Redis], Awaitable[T]], *, idempotent: bool = False
    ) -> T:
        """Await ``operation(client)``, translating errors like the sync runner."""
        attempts = 2 if idempotent else 1
        for attempt in range(attempts):
            client, _ = self._ensure_client()
            try:
                return await operation(client)
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                if attempt + 1 < attempts and str(exc) != "No connection available.":
                    continue
                raise translate(exc, self.where) from exc
            except redis.RedisError as exc:
                raise translate(exc, self.where) from exc
        raise AssertionError("unreachable")

    async def call(
        self, script: ScriptName, args: Sequence[object], *, idempotent: bool = False
    ) -> Any:
        """Run a script with the namespace KEYS (see :meth:`RedisRunner.call`)."""
        argv = [self.keys.wake_prefix, *args]
        keys = list(self.keys.fixed_keys)

        async def run(client: aioredis.Redis) -> Any:
            _, scripts = self._ensure_client()
            return await getattr(scripts, script)(keys=keys, args=argv, client=client)

        try:
            return await self.execute(run, idempotent=idempotent)
        except DatabaseError as exc:
            if "not an initialized" not in str(exc):
                raise
            self._initialized = False
            await self.ensure_initialized()
            return await self.execute(run, idempotent=idempotent)

    async def ensure_initialized(self) -> None:
        """Create or validate the namespace once per process and loop."""
        self._ensure_client()
        if self._initialized:
            return
        argv = [self.keys.wake_prefix, "init"]
        keys = list(self.keys.fixed_keys)

        async def run(client: aioredis.Redis) -> Any:
            _, scripts = self._ensure_client()
            return await scripts.init(keys=keys, args=argv, client=client)

        await self.execute(run)
        self._initialized = True

    async def aclose(self) -> None:
        """Close this process's asyncio pool (reopened on next use)."""
        client, self._client, self._scripts, self._owner = self._client, None, None, None
        if client is not None:
            await client.aclose()


_COUNTER_MASK = 0xFFF


class AsyncMessages:
    """Writes from asyncio code: one round trip (one script) per message.

    Candidate IDs follow SimpleBroker's hybrid encoding on this process's
    clock; the write script takes the larger of the candidate and the
    durable high-water + 1, exactly as for synchronous writes.
    """

    def __init__(self, runner: AsyncRedisRunner, *, max_message_size: int | None = None) -> None:
        self.runner = runner
        self._last = 0
        self._max = max_message_size or int(resolve_config()["MAX_MESSAGE_SIZE"])

    async def _candidate(self) -> int:
        waited = 0.0
        while True:
            now = time.time_ns() & ~_COUNTER_MASK
            last_phys, counter = self._last & ~_COUNTER_MASK, self._last & _COUNTER_MASK
            if now > last_phys:
                return now
            if counter < _COUNTER_MASK:
                return self._last + 1
            if waited > 1.0:
                raise TimestampError("Logical counter exhausted while waiting for clock to advance")
            await asyncio.sleep(0.0001)
            waited += 0.0001

    async def write(self, queue: str, body: str, *, delay_seconds: float = 0.0) -> int:
        """Write ``body`` to ``queue``; with a delay it is claimable only later."""
        validate_queue_name(queue)
        validate_message(body, self._max)
        if isinstance(delay_seconds, bool) or not isinstance(delay_seconds, (int, float)):
            raise TypeError("delay_seconds must be a number")
        delay_us = max(0, round(delay_seconds * 1_000_000))
        deadline = time.monotonic() + 30.0
        sleep = 0.001
        while True:
            candidate = format_id(await self._candidate())
            try:
                committed = int(
                    await self.runner.call("write", [queue, body, candidate, 0, delay_us])
                )
            except ScriptConflict as conflict:
                self._last = max(self._last, int(conflict.detail.split()[0]))
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"Failed to allocate a message ID in {self.runner.where}"
                    ) from conflict
                if conflict.code != "CLOCK":
                    await asyncio.sleep(sleep)
                    sleep = min(sleep * 2, 0.25)
                continue
            self._last = max(self._last, committed)
            return committed


class AsyncLeases:
    """Asyncio twin of :class:`~simplebroker_redis.Leases` (same scripts)."""

    def __init__(self, runner: AsyncRedisRunner) -> None:
        self.runner = runner

    async def reserve(
        self,
        queue: str,
        limit: int,
        lease_seconds: float | None,
        *,
        max_deliveries: int | None = None,
        dead_letter: str | None = None,
        order: str = "oldest",
    ) -> Lease:
        """Reserve up to ``limit`` pending messages of ``queue``."""
        token = new_token()
        args = reserve_args(
            queue,
            token,
            limit,
            lease_seconds,
            max_deliveries=max_deliveries,
            dead_letter=dead_letter,
            order=order,
        )
        return parse_reserve(token, queue, await self.runner.call("reserve", args))

    async def ack(
        self, token: str, ids: Iterable[int] | None = None, *, delete: bool = False
    ) -> Settlement:
        """Consume ``ids`` of a token (claimed, or deleted)."""
        mode: SettleMode = "delete" if delete else "claim"
        raw = await self.runner.call("settle", settle_args(token, mode, "", ids))
        return Settlement(int(raw[0]), int(raw[1]))

    async def reject(self, token: str, ids: Iterable[int] | None, queue: str) -> Settlement:
        """Move ``ids`` of a token to ``queue`` (pending, same IDs)."""
        raw = await self.runner.call("settle", settle_args(token, "move", queue, ids))
        return Settlement(int(raw[0]), int(raw[1]))

    async def release(
        self,
        token: str,
        ids: Iterable[int] | None = None,
        *,
        delay_seconds: float = 0.0,
        undeliver: bool = False,
    ) -> int:
        """Make ``ids`` of a token pending again (optionally after a delay)."""
        args = release_args(token, ids, delay_seconds, undeliver)
        return int(await self.runner.call("release", args))

    async def renew(self, tokens: Iterable[str], lease_seconds: float | None = None) -> set[str]:
        """Extend leases of ``tokens``; return the tokens that no longer exist."""
        token_list = list(tokens)
        if not token_list:
            return set()
        return set(await self.runner.call("renew", renew_args(token_list, lease_seconds)))

    async def recover(self, queue: str | None = None, *, max_tokens: int = 256) -> Recovery:
        """Release expired reservations (of ``queue`` or every queue)."""
        return parse_recovery(await self.runner.call("recover", recover_args(queue, max_tokens)))

    async def deliveries(self, message_id: int) -> int:
        """Return how many times ``message_id`` has been reserved."""
        key = self.runner.keys.deliveries
        field = format_id(int(message_id))
        value = await self.runner.execute(lambda client: client.hget(key, field), idempotent=True)
        return int(value or 0)


class AsyncActivity:
    """Asyncio wake-ups for queues, fed by the process's Pub/Sub listener thread."""

    def __init__(self, runner: AsyncRedisRunner, queue_names: Sequence[str]) -> None:
        self._runner = runner
        self._channels = tuple(runner.keys.wake_channel(q) for q in dict.fromkeys(queue_names))
        self._event: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._callback: Callable[[], None] | None = None
        self._pid = 0

    async def _ensure(self) -> asyncio.Event:
        loop = asyncio.get_running_loop()
        if self._event is None or self._loop is not loop or self._pid != os.getpid():
            self.close()
            event = asyncio.Event()

            def wake() -> None:
                loop.call_soon_threadsafe(event.set)

            self._event, self._loop, self._callback, self._pid = event, loop, wake, os.getpid()
            listener = listener_for(self._runner.sync)
            # register() may wait for the listener's first connection: keep
            # that off the event loop.
            await loop.run_in_executor(None, listener.register, self._channels, wake)
        return self._event

    async def wait(self, timeout: float) -> bool:
        """Wait for a wake-up up to ``timeout`` seconds; True when woken."""
        event = await self._ensure()
        if not event.is_set():
            try:
                await asyncio.wait_for(event.wait(), timeout)
            except TimeoutError:
                return False
        event.clear()
        return True

    def close(self) -> None:
        """Drop this object's registrations (idempotent)."""
        if self._callback is not None and self._pid == os.getpid():
            listener = listener_for(self._runner.sync)
            for channel in self._channels:
                try:
                    listener.unregister(channel, self._callback)
                except (redis.RedisError, OSError):
                    pass
        self._callback = None
        self._event = None
