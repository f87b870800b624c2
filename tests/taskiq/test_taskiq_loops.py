"""Stopping background tasks: a cancellation lost inside a command must not hang shutdown."""

from __future__ import annotations

import asyncio
import time

from simplebroker_redis.loop_tasks import stop_task


async def test_stop_task_outlasts_a_lost_cancellation():
    async def command() -> int:
        await asyncio.sleep(0)
        return 1

    async def watch() -> None:
        # redis-py sends commands through asyncio.wait_for, which on Python
        # 3.11 drops a cancel arriving together with the reply (gh-86296).
        while True:
            try:
                await asyncio.wait_for(command(), 1)
            except asyncio.CancelledError:
                raise
            await asyncio.sleep(3600)  # the watch's long wait for a wake-up

    task = asyncio.create_task(watch())
    await asyncio.sleep(0)
    await asyncio.sleep(0)  # inside wait_for, the reply arriving now
    started = time.monotonic()
    await asyncio.wait_for(stop_task(task), 5)
    assert task.done()
    assert time.monotonic() - started < 1.0


async def test_stop_task_takes_none_and_finished_tasks():
    await stop_task(None)

    async def fail() -> None:
        raise RuntimeError("boom")

    task = asyncio.create_task(fail())
    await asyncio.sleep(0)
    await stop_task(task)  # its failure is retrieved, not raised
    assert task.done()
