"""Per task name statistics of a Taskiq broker: tasks sent, runs finished.

The broker counts each task it sends (``enqueued``, or ``retried`` for the
new message of a retry: Taskiq's retry middlewares send it with a
``_retries`` label), and :class:`TaskStatsMiddleware` each run a worker
finishes (``done``, or ``failed`` when the task raised) with Taskiq's own
measure of its execution time. The counts go to the server every few
seconds (:class:`simplebroker_redis.tasks.TaskStats`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from taskiq import TaskiqMessage, TaskiqMiddleware, TaskiqResult

from simplebroker_redis.tasks import TaskStats


def count_sent(stats: TaskStats, name: str, labels: Mapping[str, Any]) -> None:
    """Count one task sent: a retry's new message when it carries ``_retries``."""
    if labels.get("_retries") not in (None, "", 0, "0"):
        stats.retried(name)
    else:
        stats.enqueued(name)


class TaskStatsMiddleware(TaskiqMiddleware):
    """Counts every run this worker finishes, per task name, with its execution time."""

    def __init__(self, stats: TaskStats) -> None:
        super().__init__()
        self._stats = stats

    def post_execute(self, message: TaskiqMessage, result: TaskiqResult[Any]) -> None:
        """Count the run: done, or failed when the task raised."""
        self._stats.finished(message.task_name, result.execution_time, ok=not result.is_err)
