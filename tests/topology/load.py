"""Load for the failover and resharding tests: writers, claimers, a Taskiq worker, a watcher.

Every component records what the server *acknowledged* (a call that
returned) separately from what failed, so a test can tell a lost
acknowledged write (a bug, or a failover without durability) from a write
whose outcome was never known.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from simplebroker.ext import OperationalError

from simplebroker_redis import RedisRunner
from simplebroker_redis.activity import open_waiter
from simplebroker_redis.core import RedisBrokerCore

#: Seconds a command may keep retrying refusals (MOVED, READONLY, ...) in these tests.
POOL_TIMEOUT = 30.0


@dataclass
class Writer:
    """Writes ``<prefix><n>`` to ``queue`` in a loop on its own thread and runner."""

    url: str
    namespace: str
    queue: str
    prefix: str
    options: dict[str, Any] = field(default_factory=dict)
    pause: float = 0.005
    acked: list[str] = field(default_factory=list)
    failed: Counter[str] = field(default_factory=Counter)  #: error type -> count

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"writer-{self.prefix}")

    def start(self) -> Writer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)

    def _run(self) -> None:
        runner = RedisRunner(
            self.url, namespace=self.namespace, pool_timeout=POOL_TIMEOUT, **self.options
        )
        core = RedisBrokerCore(runner)
        n = 0
        while not self._stop.is_set():
            body = f"{self.prefix}{n}"
            n += 1
            try:
                core.write(self.queue, body)
            except OperationalError as exc:
                self.failed[type(exc).__name__] += 1
                time.sleep(0.05)
                continue
            self.acked.append(body)
            time.sleep(self.pause)
        core.close()
        runner.shutdown()


@dataclass
class Claimer:
    """Claims (exactly once) from ``queue`` in a loop; records every body it got."""

    url: str
    namespace: str
    queue: str
    got: list[str] = field(default_factory=list)
    failed: Counter[str] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="claimer")

    def start(self) -> Claimer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)

    def _run(self) -> None:
        runner = RedisRunner(self.url, namespace=self.namespace, pool_timeout=POOL_TIMEOUT)
        core = RedisBrokerCore(runner)
        while not self._stop.is_set():
            try:
                rows = core.claim_many(self.queue, 5, with_timestamps=False)
            except OperationalError as exc:
                self.failed[type(exc).__name__] += 1
                time.sleep(0.05)
                continue
            self.got.extend(str(row) for row in rows)
            if not rows:
                time.sleep(0.01)
        core.close()
        runner.shutdown()


class Watcher:
    """A SimpleBroker activity waiter on one queue, counting its wake-ups on a thread."""

    def __init__(self, runner: RedisRunner, queue: str) -> None:
        self.waiter = open_waiter(runner, [queue], None)
        self.wakeups = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="watcher")
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if self.waiter.wait(0.2):
                self.wakeups += 1

    def woken_since(self, before: int, action: Callable[[], object], timeout: float) -> bool:
        """Run ``action`` and return whether a wake-up follows within ``timeout``."""
        action()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.wakeups > before:
                return True
            time.sleep(0.05)
        return False

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.waiter.close()


async def kick_loop(
    kick: Callable[[str], Any], acked: list[str], failed: Counter[str], stop: asyncio.Event
) -> None:
    """Kick ``t<n>`` tasks until ``stop``; record acknowledged kicks."""
    n = 0
    while not stop.is_set():
        key = f"t{n}"
        n += 1
        try:
            await kick(key)
        except Exception as exc:  # noqa: BLE001 - Taskiq wraps it in SendTaskError
            failed[type(exc.__cause__ or exc).__name__] += 1
            await asyncio.sleep(0.05)
            continue
        acked.append(key)
        await asyncio.sleep(0.02)
