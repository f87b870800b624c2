"""``AsyncActivity``: Pub/Sub wake-ups for queues, read by the event loop itself."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any, NoReturn

import redis

from ..loop_tasks import stop_task
from ..runner.aio import AsyncRedisRunner
from .outage import (
    PING_INTERVAL,
    PING_TIMEOUT,
    SUBSCRIBE_WAIT,
    Outage,
    SlotMoved,
    Unanswered,
)
from .waiter import wake_channels

logger = logging.getLogger("simplebroker_redis")


class AsyncActivity:
    """Pub/Sub wake-ups for queues, read by the running event loop itself.

    Every script that makes messages of a queue claimable publishes on the
    queue's wake channel (sharded Pub/Sub, see :mod:`..activity`). This
    subscribes (``SSUBSCRIBE``) on a dedicated asyncio connection to the
    namespace's primary (never one of the command pool), so a wake-up
    reaches a waiting coroutine without a thread hop. Wake-ups are hints:
    after every (re)connect the waiter is woken once, since one may have
    been missed, and the caller simply asks the server again. A slot that
    moved (the server's unrequested ``sunsubscribe``, or MOVED) or a failover
    is an outage like any other, handled as the sync listener handles it
    (:class:`~simplebroker_redis.activity.outage.Outage`): one warning,
    then reconnects to the new primary, backing off from 0.1 s to 2 s. An
    idle subscription sends a PING after 5 s of silence, and one left
    unanswered for 3 s ends it as an outage (a half-open connection).
    """

    def __init__(self, runner: AsyncRedisRunner, queue_names: Sequence[str]) -> None:
        self._channels = wake_channels(runner.keys, queue_names)
        self._connections = runner.connections
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
            async with asyncio.timeout(SUBSCRIBE_WAIT):
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
        await stop_task(task)  # a plain cancel() can be lost on Python 3.11

    async def _run(self) -> None:
        clock = asyncio.get_running_loop().time
        outage = Outage(self._connections, self._where)
        while True:
            client = self._connections.async_subscriber()
            pubsub: Any = client.pubsub()
            subscribed_at = None
            try:
                await pubsub.ssubscribe(*self._channels)
                subscribed_at = clock()
                self._subscribed.set()
                self._event.set()  # a wake-up may have been missed meanwhile
                outage.subscribed()
                await self._serve(pubsub)
            except Exception as exc:  # noqa: BLE001 - the subscription must outlive any failure
                delay = outage.lost(exc, None if subscribed_at is None else clock() - subscribed_at)
            finally:
                await _close_quietly(pubsub, client)
            await asyncio.sleep(delay)

    async def _serve(self, pubsub: Any) -> NoReturn:
        clock = asyncio.get_running_loop().time
        # Liveness: a PING after PING_INTERVAL s without a message, answered
        # within PING_TIMEOUT s, or the connection is given up as half-open.
        # (redis-py returns None for the replies it swallows, say those of
        # its own health checks; our PING's answer is a "pong" message.)
        heard, pinged = clock(), None
        while True:
            due = heard + PING_INTERVAL if pinged is None else pinged + PING_TIMEOUT
            message = await pubsub.get_message(timeout=max(0.0, due - clock()))
            now = clock()
            if message is not None:
                heard, pinged = now, None
                kind = message.get("type")
                if kind == "smessage":
                    self._event.set()
                elif kind == "sunsubscribe":  # never requested: the slot moved
                    raise SlotMoved(str(message["channel"]))
            elif pinged is not None:
                if now - pinged >= PING_TIMEOUT:
                    raise Unanswered
            elif now - heard >= PING_INTERVAL:
                await pubsub.ping()
                pinged = now


async def _close_quietly(*resources: Any) -> None:
    for resource in resources:
        try:
            await resource.aclose()
        except (redis.RedisError, OSError, RuntimeError):
            pass  # the connection is broken already
