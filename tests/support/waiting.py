"""Poll a condition until it holds: never a fixed sleep, generous timeouts (busy CI hosts)."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def _deadline(timeout: float, what: str) -> Callable[[], None]:
    """Return a check that raises AssertionError once ``timeout`` seconds have passed."""
    end = time.monotonic() + timeout

    def check() -> None:
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")

    return check


def wait_for(
    predicate: Callable[[], T],
    timeout: float = 30.0,
    what: str = "a condition",
    *,
    interval: float = 0.05,
) -> T:
    """Return ``predicate()`` once it is truthy; AssertionError after ``timeout`` seconds."""
    give_up = _deadline(timeout, what)
    while not (value := predicate()):
        give_up()
        time.sleep(interval)
    return value


async def eventually(
    check: Callable[[], Any], timeout: float = 30.0, interval: float = 0.05
) -> Any:
    """Like :func:`wait_for`, on the event loop; ``check`` may return an awaitable."""
    give_up = _deadline(timeout, "a condition")
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        give_up()
        await asyncio.sleep(interval)
