"""Tasks, not only messages: the task index, per task name statistics, each framework's format.

- the **task index**: a producer that names a task index key with its write
  (:func:`index_key`: ``"<framework>:<task id>"``) lets anyone find the
  message of that task in a few reads (``task_find.lua``); the scripts keep
  the index to exactly the messages that exist (``lua/lib/tasks.lua``);
- **statistics** per task name and minute (:mod:`.stats`): counted in each
  process, added up in the server;
- **formats** (:mod:`.formats`): how each integration's stored tasks and
  outcomes are read, the hook a new integration registers.

See ``docs/dashboard.md``.
"""

from __future__ import annotations

from .formats import (
    Lookups,
    TaskFormat,
    TaskInfo,
    TaskOutcome,
    describe,
    index_key,
    task_formats,
)
from .stats import INDEX_ENV, STATS_ENV, TaskStats, enabled, flush_all, task_stats

__all__ = [
    "INDEX_ENV",
    "STATS_ENV",
    "Lookups",
    "TaskFormat",
    "TaskInfo",
    "TaskOutcome",
    "TaskStats",
    "describe",
    "enabled",
    "flush_all",
    "index_key",
    "task_formats",
    "task_stats",
]
