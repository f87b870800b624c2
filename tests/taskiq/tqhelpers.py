"""Helpers for the Taskiq integration tests (importable by test modules)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from taskiq.exceptions import ScheduledTaskCancelledError
from taskiq.kicker import AsyncKicker
from taskiq.receiver import Receiver
from taskiq.scheduler.scheduled_task import ScheduledTask
from taskiq.task import AsyncTaskiqTask

from taskiq_simplebroker import (
    SimpleBrokerResultBackend,
    SimpleBrokerScheduleSource,
    SimpleBrokerTaskiqBroker,
)

HERE = Path(__file__).resolve().parent
# Worker processes import the test app (workerapp.py) from this directory.
PYTHONPATH = os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])


class Worker:
    """One ``taskiq worker`` (or ``taskiq scheduler``) process group."""

    def __init__(
        self, args: list[str], env: dict[str, str], log: Path, cwd: Path | None = None
    ) -> None:
        self.log = log
        with log.open("ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "taskiq", *args],
                env=env,
                cwd=cwd,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        return self.process.pid

    def kill(self) -> None:
        """SIGKILL the whole group (manager and its worker processes)."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def stop(self, timeout: float = 10.0) -> int:
        """Graceful stop (SIGTERM, as a supervisor sends); SIGKILL if it hangs."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.process.returncode

    def output(self) -> str:
        return self.log.read_text(errors="replace")


async def kiq(
    broker: SimpleBrokerTaskiqBroker, name: str, *args: Any, **labels: Any
) -> AsyncTaskiqTask[Any]:
    """Kick ``workerapp:<name>`` by name (the test process never imports workerapp)."""
    kicker: AsyncKicker[Any, Any] = AsyncKicker(f"workerapp:{name}", broker, labels)
    return await kicker.kiq(*args)


@dataclass(frozen=True)
class Money:
    """A return value JSON cannot hold (workerapp's ``value`` task returns it)."""

    amount: int
    currency: str


@dataclass(frozen=True)
class Event:
    """One line of the task log written by workerapp.py."""

    kind: str
    key: str
    worker: str
    pid: int
    at: float


def events(log: Path, kind: str | None = None) -> list[Event]:
    """Return the task log's events (of one ``kind``), in order."""
    if not log.exists():
        return []
    out = []
    for line in log.read_text().splitlines():
        event, key, worker, pid, stamp = line.split()
        if kind is None or event == kind:
            out.append(Event(event, key, worker, int(pid), float(stamp)))
    return out


async def eventually(check: Callable[[], Any], timeout: float, interval: float = 0.05) -> Any:
    """Poll ``check`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        await asyncio.sleep(interval)


def make_broker(redis_url: str, namespace: str, **options: Any) -> SimpleBrokerTaskiqBroker:
    options.setdefault("lease_seconds", 2.0)
    options.setdefault("heartbeat_interval", 0.5)
    broker = SimpleBrokerTaskiqBroker(redis_url, namespace=namespace, **options)
    return broker.with_result_backend(SimpleBrokerResultBackend(runner=broker.runner))


@asynccontextmanager
async def receiving(broker: SimpleBrokerTaskiqBroker, **options: Any) -> AsyncIterator[Receiver]:
    """Run Taskiq's own Receiver on ``broker`` in this process."""
    broker.is_worker_process = True
    receiver = Receiver(broker, max_async_tasks=options.pop("max_async_tasks", 100), **options)
    finish = asyncio.Event()
    task = asyncio.create_task(receiver.listen(finish))
    try:
        yield receiver
    finally:
        finish.set()
        await asyncio.wait_for(task, 10)
        await broker.shutdown()


async def claims(source: SimpleBrokerScheduleSource, task: ScheduledTask) -> bool:
    """Ask ``source`` before a send, as Taskiq's scheduler does; True: send it."""
    try:
        await source.pre_send(task)
    except ScheduledTaskCancelledError:
        return False
    return True


def scheduled(key: str, **when: Any) -> ScheduledTask:
    """A schedule of workerapp.py's ``scheduled`` task, run with argument ``key``."""
    return ScheduledTask(task_name="workerapp:scheduled", labels={}, args=[key], kwargs={}, **when)
