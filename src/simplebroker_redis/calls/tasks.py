"""Typed calls of the task scripts: the task index's lookup, tasks in flight, task statistics.

``task_find.lua`` and ``running.lua`` serve the dashboard's task views
(read only); ``task_stats.lua`` adds a process's counts to the task
statistics and ``task_stats_read.lua`` reads them (see
:mod:`simplebroker_redis.taskrecord` for the records, and
:mod:`simplebroker_redis.tasks` for who writes them).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Final

from ..keys import format_id
from ..taskrecord import TaskRecord
from ..types import Place, Running, RunningMessage, TaskLocation, TaskLookup, TaskStatsPage
from ..validation import check_task_key, validate_queue_name
from .base import Call, check_limit

#: Longest body the task views are sent per message (bytes; the rest is cut).
TASK_BODY_PREVIEW: Final[int] = 16_384

#: Most messages one ``running`` call returns.
MAX_RUNNING: Final[int] = 2000

#: Most (minute, task name) records one ``task_stats`` call carries.
MAX_STATS_RECORDS: Final[int] = 1000


def _text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def _optional(raw: str) -> int | None:
    return int(float(raw)) if raw else None


def _lookup(raw: Any) -> TaskLookup:
    now, found, results = raw
    located = []
    for item in found:
        flat = [_text(value) for value in item]
        state: Place = flat[3]  # type: ignore[assignment] # task_find.lua names no other
        located.append(
            TaskLocation(
                what=flat[0],
                id=int(flat[1]),
                written_to=flat[2],
                state=state,
                queue=flat[4],
                deliveries=int(flat[5] or 0),
                until_us=_optional(flat[6]),
                token=flat[7],
                reserved_us=_optional(flat[8]) or None,
                body=flat[9],
                size=int(flat[10]),
            )
        )
    return TaskLookup(int(_text(now)), tuple(located), tuple(_text(v) for v in results))


def task_find(
    keys: Sequence[str] = (),
    messages: Iterable[tuple[str, int]] = (),
    *,
    elsewhere: Iterable[str] = (),
    result_keys: Sequence[str] = (),
    preview: int = TASK_BODY_PREVIEW,
) -> Call[TaskLookup]:
    """``task_find.lua``: locate the messages of task index ``keys`` and of (queue, id) pairs.

    A message not in the queue it was written to is looked for in
    ``elsewhere`` (the dead-letter queues); ``result_keys`` (complete key
    names inside the namespace's hash tag) are read in the same step.
    """
    check_limit(preview)
    args: list[object] = [preview, len(keys), *(check_task_key(key) for key in keys)]
    pairs = [(validate_queue_name(queue), format_id(int(mid))) for queue, mid in messages]
    args.append(len(pairs))
    for queue, mid in pairs:
        args += (queue, mid)
    args += [validate_queue_name(queue) for queue in elsewhere]
    return Call(_lookup, "task_find", tuple(args), extra_keys=tuple(result_keys), idempotent=True)


def _running(raw: Any) -> Running:
    now, total, items = raw
    flat = [_text(value) for value in items]
    messages = tuple(
        RunningMessage(
            queue=flat[i],
            id=int(flat[i + 1]),
            token=flat[i + 2],
            reserved_us=int(flat[i + 3] or 0),
            deadline_us=_optional(flat[i + 4]),
            deliveries=int(flat[i + 5] or 0),
            body=flat[i + 6],
            size=int(flat[i + 7]),
        )
        for i in range(0, len(flat), 8)
    )
    return Running(int(_text(now)), int(total), messages)


def running(limit: int = 500, *, preview: int = TASK_BODY_PREVIEW) -> Call[Running]:
    """``running.lua``: the first ``limit`` messages in flight in any queue, and their count."""
    check_limit(limit)
    check_limit(preview)
    if limit > MAX_RUNNING:
        raise ValueError(f"limit must be at most {MAX_RUNNING}")
    return Call(_running, "running", (limit, preview), idempotent=True)


def task_stats(
    records: Iterable[tuple[int, str, TaskRecord]], *, retention_minutes: int, most_names: int
) -> Call[int]:
    """``task_stats.lua``: add (minute, task name, record) counts to the task statistics."""
    check_limit(retention_minutes)
    check_limit(most_names)
    args: list[object] = [retention_minutes, most_names]
    count = 0
    for minute, name, record in records:
        if not isinstance(name, str) or not name:
            raise ValueError("a task name must be a non-empty string")
        args += (int(minute), name, record.enqueued, record.done, record.failed)
        args += (record.retried, record.sum_us, record.histogram_text())
        count += 1
    if count > MAX_STATS_RECORDS:
        raise ValueError(f"at most {MAX_STATS_RECORDS} records per call")
    return Call(int, "task_stats", tuple(args))


def _stats_page(raw: Any) -> TaskStatsPage:
    now, minutes, totals = raw
    flat = [_text(value) for value in minutes]
    rows = []
    for field, record in zip(flat[::2], flat[1::2], strict=True):
        minute, _, name = field.partition(" ")
        if minute.isdigit():
            rows.append((int(minute), name, record))
    pairs = [_text(value) for value in totals]
    named = {name: record for name, record in zip(pairs[::2], pairs[1::2], strict=True) if name}
    return TaskStatsPage(int(_text(now)), tuple(rows), named)


def task_stats_read(first: int, last: int, *, totals: bool = False) -> Call[TaskStatsPage]:
    """``task_stats_read.lua``: the task records of minutes ``first`` to ``last`` (inclusive)."""
    if last < first:
        raise ValueError("the last minute comes before the first")
    return Call(
        _stats_page,
        "task_stats_read",
        (int(first), int(last), "1" if totals else "0"),
        idempotent=True,
    )
