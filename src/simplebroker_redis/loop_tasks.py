"""Stopping background tasks of the event loop reliably.

On Python 3.11, ``asyncio.wait_for`` returns the inner result and drops a
cancellation that arrives in the same loop iteration as that result
(CPython gh-86296, fixed in 3.12). redis-py sends every command through
``wait_for`` when a socket timeout is set, so ``task.cancel()`` on a task
that is in the middle of a command can be lost: the task goes on to its
next ``await`` (a wake-up wait of an hour, say) and ``await task`` hangs.
:func:`stop_task` cancels until the task is really done.
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

#: Seconds between repeated cancellations of a task that survived one.
RECANCEL_SECONDS: Final[float] = 0.05


async def stop_task(task: asyncio.Task[Any] | None) -> None:
    """Cancel ``task`` and wait until it is done, cancelling again if one was lost.

    Whatever the task raised (its cancellation included) is dropped: the
    caller wants it gone, not its outcome.
    """
    if task is None:
        return
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=RECANCEL_SECONDS)
    if not task.cancelled():
        task.exception()  # retrieved: a stopped task's failure is not news
