"""A Taskiq app whose tasks are SimpleBroker messages on Valkey/Redis.

Run a worker (from this directory)::

    SIMPLEBROKER_REDIS_URL=redis://127.0.0.1:6390/0 taskiq worker taskiq_app:broker

and a scheduler for the ``schedule`` labels and stored schedules::

    taskiq scheduler taskiq_app:scheduler

``producer.py`` kicks these tasks; ``broker peek taskiq`` (with the
``.broker.toml`` of this directory) shows the ones waiting.
"""

from __future__ import annotations

import asyncio
import os
from typing import Annotated, Any

from taskiq import Context, TaskiqDepends, TaskiqScheduler
from taskiq.depends.progress_tracker import ProgressTracker, TaskState
from taskiq.middlewares import SmartRetryMiddleware
from taskiq.schedule_sources import LabelScheduleSource

from taskiq_simplebroker import (
    SimpleBrokerResultBackend,
    SimpleBrokerScheduleSource,
    SimpleBrokerTaskiqBroker,
)

#: The server; ``make demo`` sets SIMPLEBROKER_REDIS_URL to the one it starts.
URL = os.environ.get("SIMPLEBROKER_REDIS_URL", "redis://127.0.0.1:6390/0")

broker = SimpleBrokerTaskiqBroker(URL, queue="taskiq").with_middlewares(
    # Retries are kicked with a `delay` label, which the broker honours itself.
    SmartRetryMiddleware(default_retry_count=3, default_delay=1.0)
)
broker.with_result_backend(SimpleBrokerResultBackend(runner=broker.runner, result_ex_time=3600))
schedule_source = SimpleBrokerScheduleSource(runner=broker.runner)
scheduler = TaskiqScheduler(broker, sources=[LabelScheduleSource(broker), schedule_source])


@broker.task
async def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@broker.task
async def slow(
    seconds: float,
    progress: Annotated[ProgressTracker[dict[str, Any]], TaskiqDepends()],
) -> str:
    """Work for ``seconds``, reporting progress in five steps."""
    steps = 5
    for step in range(steps):
        await progress.set_progress(TaskState.STARTED, {"done": step, "of": steps})
        await asyncio.sleep(seconds / steps)
    await progress.set_progress(TaskState.SUCCESS, {"done": steps, "of": steps})
    return f"worked {seconds:g} s"


@broker.task(retry_on_error=True, max_retries=4)
async def flaky(fail_times: int, context: Annotated[Context, TaskiqDepends()]) -> str:
    """Fail the first ``fail_times`` attempts; each retry waits 1 s (delay label)."""
    attempt = int(context.message.labels.get("_retries", 0)) + 1
    if attempt <= fail_times:
        raise RuntimeError(f"attempt {attempt} failed")
    return f"succeeded on attempt {attempt}"


@broker.task(schedule=[{"cron": "*/5 * * * *", "args": ["every five minutes"]}])
async def remind(note: str) -> str:
    """A task the scheduler kicks from its ``schedule`` label."""
    return note
