"""``AsyncMessages``: writes from asyncio code, group-committed per event loop."""

from __future__ import annotations

import asyncio
import os
import weakref
from dataclasses import dataclass
from typing import Any

from simplebroker.ext import TimestampError

from .. import calls
from ..errors import ScriptConflict
from ..ids import HighWaterClock
from ..retry import ConflictBackoff
from ..runner.aio import AsyncRedisRunner
from ..types import Dedupe
from ..validation import check_task_key, finite_number, validate_message, validate_queue_name

#: Seconds a write waits for the clock when the logical counter at the
#: high-water is spent (then it fails, as SimpleBroker's generator does) ...
_CLOCK_WAIT = 1.0
#: ... in sleeps of this many seconds.
_CLOCK_POLL = 0.0001

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
    task_key: str = ""
    once: Dedupe | None = None


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

    Candidate IDs come from an offline :class:`~simplebroker_redis.ids.HighWaterClock`
    (SimpleBroker's generator on this process's clock, never reading the
    server); the script takes the larger of the candidate and the durable
    high-water + 1, exactly as for synchronous writes.
    """

    def __init__(self, runner: AsyncRedisRunner, *, max_message_size: int | None = None) -> None:
        self.runner = runner
        self._clock = HighWaterClock.offline(runner.backend_plugin)
        self._max = max_message_size or runner.max_message_size
        # Batching state per event loop: loops in other threads never share
        # a batch, and a forked child starts empty.
        self._pid = os.getpid()
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopWrites] = (
            weakref.WeakKeyDictionary()
        )

    async def _candidate(self) -> int:
        # The generator would sleep for the clock on this thread: wait here
        # instead, without blocking the event loop.
        waited = 0.0
        while self._clock.exhausted():
            if waited > _CLOCK_WAIT:
                raise TimestampError("Logical counter exhausted while waiting for clock to advance")
            await asyncio.sleep(_CLOCK_POLL)
            waited += _CLOCK_POLL
        return self._clock.candidates(1)[0]

    async def write(
        self,
        queue: str,
        body: str,
        *,
        delay_seconds: float = 0.0,
        task_key: str = "",
        dedupe_key: str | None = None,
        dedupe_seconds: float = calls.DEFAULT_DEDUPE_SECONDS,
    ) -> int:
        """Write ``body`` to ``queue``; with a delay it is claimable only later.

        ``task_key`` indexes the message under a framework's task id
        (:func:`simplebroker_redis.tasks.index_key`), in the same step.
        Returns the committed message ID. Invalid input raises before anything
        is queued; a cancelled write that was not sent yet is dropped.

        ``dedupe_key`` makes the write idempotent: if a write with the same
        key stored its message within the last ``dedupe_seconds`` (or does
        in the same batch), nothing more is stored and that write's ID is
        returned. A write that failed with ``OutcomeUnknown`` can so be sent
        again without a second copy.
        """
        validate_queue_name(queue)
        validate_message(body, self._max)
        finite_number(delay_seconds, "delay_seconds")
        once = (
            None
            if dedupe_key is None
            else calls.dedupe(self.runner.keys, dedupe_key, dedupe_seconds)
        )
        loop = asyncio.get_running_loop()
        if self._pid != os.getpid():
            self._pid, self._loops = os.getpid(), weakref.WeakKeyDictionary()
        state = self._loops.get(loop)
        if state is None:
            state = self._loops[loop] = _LoopWrites()
        delay_us = max(0, round(delay_seconds * 1_000_000))
        item = _Write(queue, body, delay_us, loop.create_future(), check_task_key(task_key), once)
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
        items = [(item.queue, item.body, item.delay_us, item.task_key, item.once) for item in batch]
        backoff = ConflictBackoff(self.runner.where)
        while True:
            try:
                ids = await self.runner.run(calls.write_batch(await self._candidate(), items))
            except ScriptConflict as conflict:
                self._clock.observe(backoff.observed(conflict))
                await asyncio.sleep(backoff.after(conflict))
                continue
            self._clock.observe(max(ids))
            return ids
