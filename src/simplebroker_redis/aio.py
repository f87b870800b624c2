"""The reservation API on an asyncio client, for async integrations (Taskiq).

:class:`AsyncRedisRunner` mirrors :class:`~simplebroker_redis.RedisRunner`
(same target, options, keys, scripts and error translation) on
``redis.asyncio``. :class:`AsyncLeases` runs the very same Lua scripts as
:class:`~simplebroker_redis.Leases`; neither side re-implements a state
transition. :class:`AsyncActivity` reads the queues' Pub/Sub wake-up
channels on the event loop itself (the sync waiters use a listener thread).

Connections open lazily, per process and event loop, so a broker object made
at import time is safe to use in forked worker processes.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time
import weakref
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import redis
import redis.asyncio as aioredis
from simplebroker import resolve_config
from simplebroker.ext import TimestampError

from .errors import NamespaceMissing, ScriptConflict, translate
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

logger = logging.getLogger("simplebroker_redis")

_SUBSCRIBE_WAIT = 5.0  # seconds AsyncActivity.start waits for its subscription
_PING_INTERVAL = 30.0  # idle seconds before a subscription is checked with PING
_BACKOFF_MIN = 0.1  # reconnect backoff bounds, seconds
_BACKOFF_MAX = 5.0


@dataclass(slots=True)
class _LoopClient:
    """The client (and its registered scripts) of one event loop."""

    client: aioredis.Redis
    scripts: Scripts
    initialized: bool = False


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
        # One pool per event loop (a pool's connections belong to the loop
        # that opened them); a forked child starts with none. Entries go
        # away with their loops.
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
            pool = aioredis.BlockingConnectionPool.from_url(
                self.sync.target,
                max_connections=self.sync.options.max_connections,
                timeout=self.sync.pool_timeout,
                **self.sync.connection_kwargs(),
            )
            client = aioredis.Redis(connection_pool=pool)
            here = self._loops[loop] = _LoopClient(client, Scripts.register(client))
        return here

    def _ensure_client(self) -> tuple[aioredis.Redis, Scripts]:
        here = self._here()
        return here.client, here.scripts

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
        self,
        script: ScriptName,
        args: Sequence[object],
        *,
        idempotent: bool = False,
        extra_keys: Sequence[str] = (),
    ) -> Any:
        """Run a script with the namespace KEYS (see :meth:`RedisRunner.call`).

        ``extra_keys`` follow the fixed keys (``commit`` takes its result keys
        there); they must lie in the namespace's hash tag.
        """
        argv = [self.keys.wake_prefix, *args]
        keys = [*self.keys.fixed_keys, *extra_keys]

        async def run(client: aioredis.Redis) -> Any:
            _, scripts = self._ensure_client()
            return await getattr(scripts, script)(keys=keys, args=argv, client=client)

        try:
            return await self.execute(run, idempotent=idempotent)
        except NamespaceMissing:
            self._here().initialized = False
            await self.ensure_initialized()
            return await self.execute(run, idempotent=idempotent)

    async def ensure_initialized(self) -> None:
        """Create or validate the namespace once per process and loop."""
        here = self._here()
        if here.initialized:
            return
        argv = [self.keys.wake_prefix, "init"]
        keys = list(self.keys.fixed_keys)

        async def run(client: aioredis.Redis) -> Any:
            _, scripts = self._ensure_client()
            return await scripts.init(keys=keys, args=argv, client=client)

        await self.execute(run)
        here.initialized = True

    async def aclose(self) -> None:
        """Close the running loop's pool (reopened on next use)."""
        here = self._loops.pop(asyncio.get_running_loop(), None)
        if here is not None and self._pid == os.getpid():
            await here.client.aclose(close_connection_pool=True)


_COUNTER_MASK = 0xFFF


#: A group commit carries at most this many messages ...
_BATCH_MAX_MESSAGES = 256
#: ... and at most this many body characters (a larger message goes alone).
_BATCH_MAX_CHARS = 1 << 20


@dataclass(slots=True, eq=False)
class _Write:
    """One queued write of :class:`AsyncMessages` and the future of its ID."""

    queue: str
    body: str
    delay_us: int
    future: asyncio.Future[int]


class _LoopWrites:
    """The writes of one event loop: queued ones, and who is sending."""

    __slots__ = ("inline", "queued", "sender")

    def __init__(self) -> None:
        self.queued: list[_Write] = []
        self.sender: asyncio.Task[None] | None = None
        self.inline = False  # a write is being sent by its own caller

    def take(self) -> list[_Write]:
        """Remove and return the next batch (at least one write)."""
        batch: list[_Write] = []
        chars = 0
        for item in self.queued:
            if batch and (
                len(batch) >= _BATCH_MAX_MESSAGES or chars + len(item.body) > _BATCH_MAX_CHARS
            ):
                break
            batch.append(item)
            chars += len(item.body)
        del self.queued[: len(batch)]
        return batch


def _fail(future: asyncio.Future[Any], exc: BaseException) -> None:
    if future.done():
        return
    if isinstance(exc, asyncio.CancelledError):
        future.cancel()
    else:
        future.set_exception(exc)


class AsyncMessages:
    """Writes from asyncio code: one round trip per write, shared when concurrent.

    Concurrent writers of one event loop share round trips (group commit):
    a write with nothing in flight is sent at once by its caller, and writes
    arriving meanwhile go together in the next ``write_batch`` script (sent by
    a background task), which commits them all or none. Each write still
    waits for its own commit and gets its own ID; under load a producer
    needs far fewer round trips than messages.

    Candidate IDs follow SimpleBroker's hybrid encoding on this process's
    clock; the script takes the larger of the candidate and the durable
    high-water + 1, exactly as for synchronous writes.
    """

    def __init__(self, runner: AsyncRedisRunner, *, max_message_size: int | None = None) -> None:
        self.runner = runner
        self._last = 0
        self._max = max_message_size or int(resolve_config()["MAX_MESSAGE_SIZE"])
        # Batching state per event loop: loops in other threads never share
        # a batch, and a forked child starts empty.
        self._pid = os.getpid()
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopWrites] = (
            weakref.WeakKeyDictionary()
        )

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
        """Write ``body`` to ``queue``; with a delay it is claimable only later.

        Returns the committed message ID. Invalid input raises before anything
        is queued; a cancelled write that was not sent yet is dropped.
        """
        validate_queue_name(queue)
        validate_message(body, self._max)
        if isinstance(delay_seconds, bool) or not isinstance(delay_seconds, (int, float)):
            raise TypeError("delay_seconds must be a number")
        if not math.isfinite(delay_seconds):
            raise ValueError("delay_seconds must be a finite number")
        loop = asyncio.get_running_loop()
        if self._pid != os.getpid():
            self._pid, self._loops = os.getpid(), weakref.WeakKeyDictionary()
        state = self._loops.get(loop)
        if state is None:
            state = self._loops[loop] = _LoopWrites()
        item = _Write(queue, body, max(0, round(delay_seconds * 1_000_000)), loop.create_future())
        if state.sender is None and not state.inline:
            # Nothing in flight: send this write now, from this task (no hop).
            state.inline = True
            try:
                return (await self._commit([item]))[0]
            finally:
                state.inline = False
                self._start_sender(loop, state)
        state.queued.append(item)
        if not state.inline:
            self._start_sender(loop, state)
        try:
            return await item.future
        except asyncio.CancelledError:
            if item in state.queued:
                state.queued.remove(item)
            raise

    def _start_sender(self, loop: asyncio.AbstractEventLoop, state: _LoopWrites) -> None:
        if state.queued and state.sender is None:
            state.sender = loop.create_task(self._send_all(state), name="simplebroker-redis-writes")

    async def _send_all(self, state: _LoopWrites) -> None:
        try:
            while state.queued:
                batch = state.take()
                try:
                    ids = await self._commit(batch)
                except BaseException as exc:
                    if not isinstance(exc, Exception):
                        # Cancelled (the loop is closing): nobody will send the rest.
                        batch += state.queued
                        state.queued.clear()
                    for item in batch:
                        _fail(item.future, exc)
                    if not isinstance(exc, Exception):
                        raise
                    continue
                for item, committed in zip(batch, ids, strict=True):
                    if not item.future.done():
                        item.future.set_result(committed)
        finally:
            state.sender = None

    async def _commit(self, batch: list[_Write]) -> list[int]:
        args: list[object] = [""]
        for item in batch:
            args += (item.queue, item.body, item.delay_us)
        deadline = time.monotonic() + 30.0
        sleep = 0.001
        while True:
            args[0] = format_id(await self._candidate())
            try:
                ids = [int(raw) for raw in await self.runner.call("write_batch", args)]
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
            self._last = max(self._last, ids[-1])
            return ids


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
    """Pub/Sub wake-ups for queues, read by the running event loop itself.

    Every script that makes messages of a queue claimable publishes on the
    queue's wake channel. This subscribes on a dedicated asyncio connection
    (never one of the command pool), so a wake-up reaches a waiting
    coroutine without a thread hop. Wake-ups are hints: after every
    (re)connect the waiter is woken once, since one may have been missed,
    and the caller simply asks the server again. Reconnects back off from
    0.1 s to 5 s; an idle subscription sends one PING per 30 s.
    """

    def __init__(self, runner: AsyncRedisRunner, queue_names: Sequence[str]) -> None:
        names = list(dict.fromkeys(queue_names))
        if not names:
            raise ValueError("queue_names cannot be empty")
        for name in names:
            validate_queue_name(name)
        self._target = runner.sync.target
        self._kwargs: dict[str, Any] = runner.sync.connection_kwargs()
        # A subscribed connection idles between messages: no read timeout.
        self._kwargs.update(socket_timeout=None, socket_keepalive=True)
        self._kwargs["client_name"] = f"simplebroker-redis-wake:{os.getpid()}"
        self._channels = [runner.keys.wake_channel(name) for name in names]
        self._where = runner.where
        self._event = asyncio.Event()
        self._subscribed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Subscribe; return once subscribed, or after a few seconds."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name="simplebroker-redis-wakeups"
            )
        try:
            async with asyncio.timeout(_SUBSCRIBE_WAIT):
                await self._subscribed.wait()
        except TimeoutError:
            logger.warning("no wake-up subscription yet at %s; retrying", self._where)

    async def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a wake-up; True when woken."""
        if self._task is None:
            await self.start()
        event = self._event
        if not event.is_set():
            try:
                async with asyncio.timeout(timeout):
                    await event.wait()
            except TimeoutError:
                return False
        event.clear()
        return True

    async def close(self) -> None:
        """Unsubscribe and close the connection (idempotent)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass

    async def _run(self) -> None:
        clock = asyncio.get_running_loop().time
        backoff = _BACKOFF_MIN
        failing = False
        while True:
            client = aioredis.Redis.from_url(self._target, **self._kwargs)
            pubsub: Any = client.pubsub(ignore_subscribe_messages=True)
            subscribed_at = None
            try:
                await pubsub.subscribe(*self._channels)
                subscribed_at = clock()
                self._subscribed.set()
                self._event.set()  # a wake-up may have been missed meanwhile
                if failing:
                    logger.info("wake-up subscription at %s restored", self._where)
                failing = False
                await self._serve(pubsub)
            except Exception as exc:  # noqa: BLE001 - the subscription must outlive any failure
                if not failing:
                    kind = "lost" if isinstance(exc, (redis.RedisError, OSError)) else "failed"
                    logger.warning("wake-up subscription at %s %s: %r", self._where, kind, exc)
                failing = True
            finally:
                await _close_quietly(pubsub, client)
            if subscribed_at is not None and clock() - subscribed_at > _BACKOFF_MAX:
                backoff = _BACKOFF_MIN  # it worked for a while: reconnect quickly
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, _BACKOFF_MAX)

    async def _serve(self, pubsub: Any) -> None:
        clock = asyncio.get_running_loop().time
        while True:
            started = clock()
            message = await pubsub.get_message(timeout=_PING_INTERVAL)
            if message is not None:
                if message.get("type") == "message":
                    self._event.set()
            elif clock() - started >= _PING_INTERVAL:
                # Idle: check the connection. (None alone does not mean idle:
                # redis-py also returns None for replies it ignores, such as
                # a decoded PONG, so pinging on None would never stop.)
                await pubsub.ping()


async def _close_quietly(*resources: Any) -> None:
    for resource in resources:
        try:
            await resource.aclose()
        except (redis.RedisError, OSError, RuntimeError):
            pass  # the connection is broken already
