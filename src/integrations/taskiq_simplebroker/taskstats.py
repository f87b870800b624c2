"""Per task name statistics of a Taskiq broker: tasks sent, runs finished.

The broker counts each task it sends (``enqueued``, or ``retried`` for the
new message of a retry: Taskiq's retry middlewares send it with a
``_retries`` label), and :class:`TaskStatsMiddleware` each run a worker
finishes (``done``, or ``failed`` when the task raised) with Taskiq's own
measure of its execution time. The counts go to the server every few
seconds (:class:`simplebroker_redis.tasks.TaskStats`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from taskiq import TaskiqMessage, TaskiqMiddleware, TaskiqResult

from simplebroker_redis import tasks
from simplebroker_redis.runner import RunnerBase
from simplebroker_redis.tasks import TaskStats

from .taskformat import FRAMEWORK


def count_sent(stats: TaskStats, name: str, labels: Mapping[str, Any]) -> None:
    """Count one task sent: a retry's new message when it carries ``_retries``."""
    if labels.get("_retries") not in (None, "", 0, "0"):
        stats.retried(name)
    else:
        stats.enqueued(name)


class Tracking:
    """What a broker keeps of the tasks it sends: their index keys, their counts.

    ``index`` and ``stats`` are the broker's ``task_index`` and
    ``task_stats`` options (None: the environment's rule,
    :func:`simplebroker_redis.tasks.enabled`).
    """

    def __init__(self, runner: RunnerBase, *, index: bool | None, stats: bool | None) -> None:
        self.index = tasks.enabled(index, tasks.INDEX_ENV)
        #: This process's task statistics (None: off).
        self.stats = tasks.task_stats(runner) if tasks.enabled(stats) else None

    def middlewares(self) -> list[TaskiqMiddleware]:
        """Return the middlewares that count a worker's runs (none when statistics are off)."""
        return [] if self.stats is None else [TaskStatsMiddleware(self.stats)]

    def key(self, task_id: str) -> str:
        """Return the task index key of a task sent ('' when the index is off)."""
        return tasks.index_key(FRAMEWORK, task_id) if self.index else ""

    def sent(self, name: str, labels: Mapping[str, Any]) -> None:
        """Count one task sent."""
        if self.stats is not None:
            count_sent(self.stats, name, labels)

    async def flush(self) -> None:
        """Send the counts now (the broker shuts down), off the event loop."""
        if self.stats is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.stats.flush)


class TaskStatsMiddleware(TaskiqMiddleware):
    """Counts every run this worker finishes, per task name, with its execution time."""

    def __init__(self, stats: TaskStats) -> None:
        super().__init__()
        self._stats = stats

    def post_execute(self, message: TaskiqMessage, result: TaskiqResult[Any]) -> None:
        """Count the run: done, or failed when the task raised."""
        self._stats.finished(message.task_name, result.execution_time, ok=not result.is_err)
