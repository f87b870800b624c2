"""The Taskiq app the tests run under ``taskiq worker`` (configured by environment).

``TQ_*`` variables pick the namespace, queue and lease settings, so every
test runs its own worker against its own namespace.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Annotated

from taskiq import Context, TaskiqDepends, TaskiqScheduler
from taskiq.depends.progress_tracker import ProgressTracker, TaskState
from taskiq.middlewares import SmartRetryMiddleware
from taskiq.schedule_sources import LabelScheduleSource
from taskiq.serializers import PickleSerializer
from tqhelpers import Money

from support.eventlog import note, read_events
from taskiq_simplebroker import (
    SimpleBrokerResultBackend,
    SimpleBrokerScheduleSource,
    SimpleBrokerTaskiqBroker,
)


def _timing() -> dict[str, float]:
    """Lease settings: fast ones for tests, the broker's own with TQ_LEASE=default."""
    if os.environ.get("TQ_LEASE") == "default":
        return {}
    return {
        "lease_seconds": float(os.environ.get("TQ_LEASE", "1.0")),
        "heartbeat_interval": float(os.environ.get("TQ_HEARTBEAT", "0.2")),
    }


def _durability() -> dict[str, float]:
    """``wait_replicas``/``wait_timeout`` from TQ_WAIT_REPLICAS/TQ_WAIT_TIMEOUT (none: off)."""
    if not os.environ.get("TQ_WAIT_REPLICAS"):
        return {}
    return {
        "wait_replicas": int(os.environ["TQ_WAIT_REPLICAS"]),
        "wait_timeout": float(os.environ.get("TQ_WAIT_TIMEOUT", "1.0")),
    }


def _optional_int(name: str) -> int | None:
    value = os.environ.get(name, "")
    return int(value) if value else None


if os.environ.get("TQ_ROOT_LOG_LEVEL"):
    # An app that configures logging itself (run with --no-configure-logging).
    logging.basicConfig(level=os.environ["TQ_ROOT_LOG_LEVEL"])

#: TQ_QUEUES="a,b": listen on several queues, in that order (else TQ_QUEUE or "taskiq").
_QUEUES = [name for name in os.environ.get("TQ_QUEUES", "").split(",") if name]

broker = SimpleBrokerTaskiqBroker(
    namespace=os.environ["TQ_NAMESPACE"],
    **({"queues": _QUEUES} if _QUEUES else {"queue": os.environ.get("TQ_QUEUE", "taskiq")}),
    prefetch=int(os.environ.get("TQ_PREFETCH", "8")),
    max_deliveries=_optional_int("TQ_MAX_DELIVERIES"),
    **_timing(),
    **_durability(),
).with_middlewares(SmartRetryMiddleware(default_retry_count=3, default_delay=0.5))
broker.with_result_backend(
    SimpleBrokerResultBackend(
        runner=broker.runner,
        keep_results=os.environ.get("TQ_KEEP_RESULTS", "1") == "1",
        result_px_time=_optional_int("TQ_RESULT_PX"),
        serializer=PickleSerializer() if os.environ.get("TQ_RESULTS") == "pickle" else None,
    )
)
schedule_source = SimpleBrokerScheduleSource(
    runner=broker.runner, claim_seconds=float(os.environ.get("TQ_CLAIM_SECONDS", "30"))
)
scheduler = TaskiqScheduler(broker, sources=[LabelScheduleSource(broker), schedule_source])
#: Only the namespace's schedules: any number of these schedulers send each run once.
ha_scheduler = TaskiqScheduler(broker, sources=[schedule_source])

LOG = os.environ.get("TQ_LOG", os.devnull)
NAME = os.environ.get("TQ_NAME", "worker")


def log(event: str, key: object) -> None:
    """Note ``event`` of task ``key`` in the test's event log, with this worker's name."""
    note(LOG, event, key, NAME)


def attempts(key: str) -> int:
    """Return how many attempts of task ``key`` have been logged (by any worker)."""
    return sum(1 for event in read_events(LOG, "attempt") if event.words[0] == key)


@broker.task
async def add(a: int, b: int) -> int:
    return a + b


@broker.task
async def loop_kind() -> str:
    """The running event loop's class (uvloop's when it is installed)."""
    loop = type(asyncio.get_running_loop())
    return f"{loop.__module__}.{loop.__qualname__}"


@broker.task
async def slow(
    seconds: float, progress: Annotated[ProgressTracker[dict[str, int]], TaskiqDepends()]
) -> str:
    steps = 4
    for step in range(steps):
        await progress.set_progress(TaskState.STARTED, {"step": step, "of": steps})
        await asyncio.sleep(seconds / steps)
    return "slept"


@broker.task
async def record(key: str, seconds: float = 0.0) -> str:
    log("start", key)
    await asyncio.sleep(seconds)
    log("done", key)
    return key


@broker.task
async def witness(key: str, seconds: float) -> list[object]:
    """Work ``seconds``; return the key and this process's pid (who wrote the result)."""
    log("start", key)
    await asyncio.sleep(seconds)
    log("done", key)
    return [key, os.getpid()]


@broker.task
async def block_loop(key: str, seconds: float) -> str:
    """Blocks the whole event loop (as careless sync code does) for ``seconds``."""
    log("start", key)
    time.sleep(seconds)
    log("done", key)
    return key


@broker.task(retry_on_error=True, max_retries=3, delay=0.6)
async def flaky(key: str, failures: int) -> int:
    log("attempt", key)
    tried = attempts(key)
    if tried <= failures:
        raise RuntimeError(f"failure {tried}")
    return tried


@broker.task
async def poison(key: str) -> None:
    log("start", key)
    os._exit(1)  # a task that takes its worker down with it


@broker.task
async def refuse(key: str, context: Annotated[Context, TaskiqDepends()]) -> None:
    log("start", key)
    context.reject()


@broker.task(schedule=[{"cron": "* * * * *", "args": ["label"]}])
async def scheduled(key: str) -> str:
    log("scheduled", key)
    return key


@broker.task
async def value(kind: str) -> object:
    """Return something JSON cannot hold."""
    if kind == "bytes":
        return b"\x00\xffraw"
    return Money(12, "EUR")


@broker.task
async def fail_once(key: str) -> str:
    """Fail the first attempt (retried by SmartRetryMiddleware when labelled so)."""
    log("attempt", key)
    if attempts(key) == 1:
        raise RuntimeError("first attempt fails")
    return key


@broker.task
async def requeue_once(
    key: str, keep_delay: bool, context: Annotated[Context, TaskiqDepends()]
) -> str:
    """Requeue itself once, with or without its ``delay`` label."""
    log("attempt", key)
    if "X-Taskiq-requeue" not in context.message.labels:
        if not keep_delay:
            context.message.labels.pop("delay", None)
        await context.requeue()
    return key
