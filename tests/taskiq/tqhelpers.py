"""What the Taskiq tests need beyond tests/support: kicks, schedules and workerapp.py's task log."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from taskiq.exceptions import ScheduledTaskCancelledError
from taskiq.kicker import AsyncKicker
from taskiq.receiver import Receiver
from taskiq.scheduler.scheduled_task import ScheduledTask
from taskiq.task import AsyncTaskiqTask

from support.eventlog import read_events
from support.processes import pythonpath
from taskiq_simplebroker import (
    SimpleBrokerResultBackend,
    SimpleBrokerScheduleSource,
    SimpleBrokerTaskiqBroker,
)

#: ``PYTHONPATH`` of worker processes: the test app (workerapp.py) is in this directory.
PYTHONPATH = pythonpath(Path(__file__).resolve().parent)


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
    """One event workerapp.py's tasks note: what, of which task key, in which worker."""

    kind: str
    key: str
    worker: str
    pid: int
    at: float


def events(log: Path, kind: str | None = None) -> list[Event]:
    """Return the task log's events (of one ``kind``), in order."""
    return [
        Event(event.kind, event.words[0], event.words[1], event.pid, event.at)
        for event in read_events(log, kind)
    ]


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
