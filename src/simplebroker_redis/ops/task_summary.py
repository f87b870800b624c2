"""Task statistics read back: per-minute series and per-name summaries.

The dashboard's charts and table and the exporter's metrics read the same
records (``task_stats_read.lua``, :mod:`simplebroker_redis.taskrecord`); this module turns
a page of them into what each shows. Percentiles are those of the
histogram buckets (at most 19 % above the true value).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

from simplebroker_redis.taskrecord import EVENTS, TaskRecord, combined
from simplebroker_redis.types import TaskStatsPage

#: The percentiles shown and exported.
QUANTILES: Final[tuple[tuple[str, float], ...]] = (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))

#: Name of the series that adds up every task name.
ALL: Final[str] = ""


def record_json(record: TaskRecord) -> dict[str, Any]:
    """Return a record's counts, mean and percentiles (seconds; None without runs)."""
    out: dict[str, Any] = {event: record.count(event) for event in EVENTS}
    runs = record.runs
    out["runs"] = runs
    out["mean"] = record.sum_us / runs / 1e6 if runs else None
    for label, q in QUANTILES:
        out[label] = record.percentile(q)
    return out


def by_minute(page: TaskStatsPage, name: str = ALL) -> dict[int, TaskRecord]:
    """Return minute -> record of task ``name`` (every name added up by default)."""
    out: dict[int, TaskRecord] = {}
    for minute, task, text in page.minutes:
        if name == ALL or task == name:
            out.setdefault(minute, TaskRecord()).add(TaskRecord.parse(text))
    return out


def by_name(page: TaskStatsPage) -> dict[str, TaskRecord]:
    """Return task name -> its records of the page's minutes added up."""
    out: dict[str, TaskRecord] = {}
    for _, task, text in page.minutes:
        out.setdefault(task, TaskRecord()).add(TaskRecord.parse(text))
    return out


def series(page: TaskStatsPage, first: int, last: int, name: str = ALL) -> dict[str, Any]:
    """Return per-minute series (counts and percentiles) of minutes ``first`` to ``last``."""
    minutes = list(range(first, last + 1))
    records = by_minute(page, name)
    empty = TaskRecord()
    rows = [records.get(minute, empty) for minute in minutes]
    out: dict[str, Any] = {"minutes": [minute * 60 for minute in minutes]}
    for event in EVENTS:
        out[event] = [row.count(event) for row in rows]
    for label, q in QUANTILES:
        out[label] = [row.percentile(q) for row in rows]
    return out


def names_table(page: TaskStatsPage) -> list[dict[str, Any]]:
    """Return every task name of the page with its window's summary, busiest first."""
    rows = [{"name": name, **record_json(record)} for name, record in by_name(page).items()]
    return sorted(rows, key=lambda row: (-(row["enqueued"] + row["runs"]), row["name"]))


def totals(page: TaskStatsPage) -> dict[str, TaskRecord]:
    """Return task name -> its record since the namespace began."""
    return {name: TaskRecord.parse(text) for name, text in page.totals.items()}


def top(records: dict[str, TaskRecord], most: int, other: str = "other") -> dict[str, TaskRecord]:
    """Return the ``most`` busiest names, the rest added up under ``other``."""
    ranked = sorted(records, key=lambda n: (-(records[n].enqueued + records[n].runs), n))
    kept = {name: records[name] for name in ranked[:most] if name != other}
    rest: Iterable[TaskRecord] = (records[n] for n in ranked if n not in kept)
    if len(kept) < len(ranked):
        kept[other] = combined(rest)
    return kept
