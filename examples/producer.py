"""Kick the tasks of ``taskiq_app.py``; show their progress and results.

Start a worker first (see taskiq_app.py), then::

    SIMPLEBROKER_REDIS_URL=redis://127.0.0.1:6390/0 python producer.py
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from taskiq_app import add, broker, flaky, slow

Show = Callable[[str], None]


async def run(show: Show = print, while_delayed: Callable[[], None] | None = None) -> None:
    """Kick every kind of task once and report what happens."""
    started = time.perf_counter()
    task = await add.kiq(2, 3)
    result = await task.wait_result(check_interval=0.01, timeout=30)
    elapsed = (time.perf_counter() - started) * 1000
    show(f"add(2, 3) = {result.return_value}   ({elapsed:.0f} ms, incl. the worker's start)")

    task = await slow.kiq(2.5)
    last = None
    while not await task.is_ready():
        progress = await task.get_progress()
        if progress is not None and progress.meta != last:
            last = progress.meta
            show(f"slow(2.5) progress: {last['done']}/{last['of']} steps")
        await asyncio.sleep(0.1)
    show(f"slow(2.5) = {(await task.get_result()).return_value!r}")

    started = time.perf_counter()
    task = await flaky.kiq(2)
    result = await task.wait_result(check_interval=0.05, timeout=30)
    show(
        f"flaky(2) = {result.return_value!r}   (two failures retried 1 s apart by the "
        f"broker's native delay: {time.perf_counter() - started:.1f} s)"
    )

    started = time.perf_counter()
    task = await add.kicker().with_labels(delay=2).kiq(20, 22)
    show("add(20, 22) kicked with delay=2: pending but invisible to workers until due")
    if while_delayed is not None:
        while_delayed()
    result = await task.wait_result(check_interval=0.02, timeout=30)
    show(f"add(20, 22) = {result.return_value}   (after {time.perf_counter() - started:.1f} s)")

    count = 500
    started = time.perf_counter()
    tasks = await asyncio.gather(*(add.kiq(i, i) for i in range(count)))
    results = [await t.wait_result(check_interval=0.01, timeout=60) for t in tasks]
    assert [r.return_value for r in results] == [2 * i for i in range(count)]
    elapsed = time.perf_counter() - started
    show(f"{count} add tasks kicked and done in {elapsed:.2f} s ({count / elapsed:.0f} tasks/s)")


async def main() -> None:
    """Run :func:`run` as a standalone producer."""
    await broker.startup()
    try:
        await run()
    finally:
        await broker.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
