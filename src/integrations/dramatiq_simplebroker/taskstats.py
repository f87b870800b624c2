"""Per actor statistics of a Dramatiq broker: tasks sent, runs finished.

:class:`TaskStatsMiddleware`, which the broker adds to its middleware
unless ``task_stats=False`` (or ``SIMPLEBROKER_REDIS_TASK_STATS=0``),
counts per actor name (Dramatiq's "task name"):

- ``enqueued``: a message sent (``after_enqueue``, in the producer);
- ``retried``: a message sent again by the ``Retries`` middleware (its
  ``retries`` option is above 0), in the worker that ran it;
- ``done`` / ``failed``: a run that returned / raised (``after_process_message``,
  a ``Retry`` too), with its execution time from ``before_process_message``.
  A skipped message (a lost lease, ``AgeLimit``) is not a run.

The counts go to the server every few seconds, when the worker shuts down,
and when the broker is closed (:class:`simplebroker_redis.tasks.TaskStats`).
"""

from __future__ import annotations

import time
from typing import Any

from dramatiq.middleware import Middleware

from simplebroker_redis.tasks import TaskStats


def is_retry(message: Any) -> bool:
    """Return True for a message the ``Retries`` middleware sends again."""
    options = getattr(message, "options", None)
    return isinstance(options, dict) and bool(options.get("retries"))


class TaskStatsMiddleware(Middleware):
    """Counts the messages this process sends and the runs it finishes, per actor."""

    def __init__(self, stats: TaskStats) -> None:
        self.stats = stats
        self._started: dict[str, float] = {}  #: message ID -> when its run began

    def after_enqueue(self, broker: Any, message: Any, delay: Any) -> None:
        """Count one message sent: a retry when ``Retries`` sends it again."""
        if is_retry(message):
            self.stats.retried(message.actor_name)
        else:
            self.stats.enqueued(message.actor_name)

    def before_process_message(self, broker: Any, message: Any) -> None:
        """Note when the run begins."""
        self._started[message.message_id] = time.perf_counter()

    def after_process_message(
        self, broker: Any, message: Any, *, result: Any = None, exception: Any = None
    ) -> None:
        """Count the run: done, or failed when the actor raised."""
        started = self._started.pop(message.message_id, None)
        if started is not None:
            seconds = time.perf_counter() - started
            self.stats.finished(message.actor_name, seconds, ok=exception is None)

    def after_skip_message(self, broker: Any, message: Any) -> None:
        """Forget a message that was not run."""
        self._started.pop(message.message_id, None)

    def after_worker_shutdown(self, broker: Any, worker: Any) -> None:
        """Send the counts now (the worker stopped)."""
        self.stats.flush()
