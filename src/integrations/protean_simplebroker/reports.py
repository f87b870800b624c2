"""What ``broker.info()`` and ``broker.health_stats()`` report, read from the queues.

Everything is derived from the stored queues (``list_queue_stats`` and the
groups' registrations), so every process reports the same numbers, except
``consumers``: the consumer names this process has read a group with.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

from simplebroker import QueueStats

from .groups import Groups
from .names import Layout, Parsed
from .store import Store

logger = logging.getLogger("protean_simplebroker")

T = TypeVar("T")


def queue_stats(store: Store, layout: Layout) -> list[tuple[Parsed, QueueStats]]:
    """Return every queue of this provider with what it is."""
    out = []
    for stats in store.conn.list_queue_stats(prefix=layout.all_prefix):
        parsed = layout.parse(stats.queue)
        if parsed is not None:
            out.append((parsed, stats))
    return out


def consumer_groups(
    store: Store, layout: Layout, groups: Groups, consumers: dict[str, set[str]]
) -> dict[str, Any]:
    """Return ``info()['consumer_groups']``: one entry per group name, streams merged."""
    pending: dict[tuple[str, str], int] = {}
    for parsed, stats in queue_stats(store, layout):
        if parsed.kind in ("group", "held") and parsed.group is not None:
            key = (parsed.stream, parsed.group)
            pending[key] = pending.get(key, 0) + stats.pending
    out: dict[str, Any] = {}
    for stream, name in groups.registered():
        group = groups.ensure(stream, name)
        copied = pending.get((stream, name), 0)
        waiting = copied + groups.backlog(group)
        entry = out.setdefault(
            name,
            {
                "consumers": sorted(consumers.get(name, ())),
                "consumer_count": len(consumers.get(name, ())),
                "created_at": group.created_at,
                "pending": 0,
                "streams": {},
            },
        )
        entry["created_at"] = min(entry["created_at"], group.created_at)
        entry["pending"] += waiting
        entry["streams"][stream] = {"pending": waiting, "copied": copied}
    return out


def message_counts(store: Store, layout: Layout) -> dict[str, int]:
    """Return messages in stream logs, held by consumers, and dead-lettered."""
    logs = dead = 0
    every = queue_stats(store, layout)
    for parsed, stats in every:
        if parsed.kind == "log":
            if parsed.stream.endswith(":dlq"):
                dead += stats.pending
            else:
                logs += stats.pending
        elif parsed.kind == "dead":
            dead += stats.pending
    return {
        "total_messages": logs,
        "in_flight": store.held_count(every),
        # A nack hands a message back at once: nothing waits in a failed state.
        "failed": 0,
        "dlq": dead,
    }


def streams(store: Store, layout: Layout) -> dict[str, Any]:
    """Return the streams that have a log."""
    names = sorted(p.stream for p, _ in queue_stats(store, layout) if p.kind == "log")
    return {"count": len(names), "names": names}


def group_names(groups: Groups) -> dict[str, Any]:
    """Return the registered group names."""
    names = sorted({name for _, name in groups.registered()})
    return {"count": len(names), "names": names}


def fallback(kind: str) -> dict[str, Any]:
    """Return the value a report section takes when it could not be computed."""
    if kind == "message_counts":
        return {"total_messages": 0, "in_flight": 0, "failed": 0, "dlq": 0}
    return {"count": 0, "names": []}


def section(kind: str, compute: Callable[[], T]) -> T | dict[str, Any]:
    """Return ``compute()``, or the section's :func:`fallback`: a health report never raises."""
    try:
        return compute()
    except Exception as exc:  # noqa: BLE001 - a health report never raises
        logger.debug("health section %s failed: %s", kind, exc)
        return fallback(kind)
