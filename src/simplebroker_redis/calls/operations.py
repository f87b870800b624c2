"""Typed calls of the operations scripts: metrics, the dashboard, worker beats.

These scripts serve the people who run a namespace rather than the
messages' producers and consumers: ``depths.lua`` (a snapshot of every
queue, read only), ``inspect.lua`` (one queue's messages, read only),
``dead_letter_requeue.lua`` (dead letters back to work) and
``worker_beat.lua`` (a worker's heartbeat record). Like the other
builders, each function validates its arguments and returns a
:class:`~.base.Call` that either runner executes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any, Final

from ..keys import format_id
from ..types import (
    JournalEntry,
    MessageView,
    QueueDepth,
    QueueView,
    Snapshot,
    StateView,
    WorkerRecord,
)
from ..validation import validate_queue_name
from .base import Call

#: Longest body the dashboard is sent per message (bytes; the rest is cut).
BODY_PREVIEW: Final[int] = 2000

#: Most messages ``inspect`` returns per state.
MAX_INSPECT: Final[int] = 1000


def id_time_us(message_id: int) -> int:
    """Return when a message ID was made (microseconds since the epoch).

    SimpleBroker's IDs are hybrid timestamps: nanoseconds since the epoch
    whose low 12 bits hold a logical counter.
    """
    return (message_id & ~0xFFF) // 1000


def _text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


# -- depths.lua -------------------------------------------------------------------
def _workers(raw: Any) -> tuple[WorkerRecord, ...]:
    out = []
    flat = [_text(item) for item in raw]
    for name, value in zip(flat[::2], flat[1::2], strict=True):
        beat, _, record = value.partition(" ")
        try:
            info = json.loads(record)
        except ValueError:
            info = {}
        if not isinstance(info, dict):
            info = {}
        out.append(WorkerRecord(name, int(beat) if beat.isdigit() else 0, info))
    return tuple(out)


def _counters(raw: Any) -> dict[tuple[str, str], int]:
    flat = [_text(item) for item in raw]
    out: dict[tuple[str, str], int] = {}
    for name, value in zip(flat[::2], flat[1::2], strict=True):
        queue, _, event = name.rpartition(" ")
        if queue and value.lstrip("-").isdigit():
            out[(queue, event)] = int(value)
    return out


def _snapshot(raw: Any) -> Snapshot:
    now, cursor, targets, rows, workers, counters = raw
    flat = [_text(item) for item in rows]
    queues = []
    for i in range(0, len(flat), 6):
        oldest = flat[i + 5]
        queues.append(
            QueueDepth(
                flat[i],
                int(flat[i + 1]),
                int(flat[i + 2]),
                int(flat[i + 3]),
                int(flat[i + 4]),
                id_time_us(int(oldest)) if oldest else None,
            )
        )
    return Snapshot(
        int(_text(now)),
        _text(cursor),
        tuple(_text(name) for name in targets),
        tuple(queues),
        _workers(workers),
        _counters(counters),
    )


def depths(after: str = "", limit: int = 0) -> Call[Snapshot]:
    """``depths.lua``: depths of the queues after ``after`` (``limit`` 0: all)."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise ValueError("limit must be a non-negative integer")
    return Call(_snapshot, "depths", (after, limit), idempotent=True)


# -- inspect.lua ------------------------------------------------------------------
def _score(raw: str) -> int | None:
    return int(float(raw)) if raw else None


def _state(raw: Any) -> StateView:
    state, count, items = raw
    flat = [_text(item) for item in items]
    messages = tuple(
        MessageView(
            int(flat[i]),
            flat[i + 1],
            int(flat[i + 2]),
            int(flat[i + 3]),
            _score(flat[i + 4]),
            flat[i + 5],
        )
        for i in range(0, len(flat), 6)
    )
    return StateView(_text(state), int(count), messages)  # type: ignore[arg-type]  # a State: inspect.lua names no other


def _queue_view(raw: Any) -> QueueView:
    now, *states, journal = raw
    flat = [_text(item) for item in journal]
    entries = tuple(
        JournalEntry(int(flat[i]), flat[i + 1], int(flat[i + 2]), flat[i + 3])
        for i in range(0, len(flat), 4)
    )
    return QueueView(int(_text(now)), tuple(_state(item) for item in states), entries)


def inspect(queue: str, limit: int = 100, *, journal: bool = False) -> Call[QueueView]:
    """``inspect.lua``: the first ``limit`` messages of each state of ``queue``."""
    validate_queue_name(queue)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_INSPECT:
        raise ValueError(f"limit must be an integer from 1 to {MAX_INSPECT}")
    args = (queue, limit, BODY_PREVIEW, "1" if journal else "0")
    return Call(_queue_view, "inspect", args, idempotent=True)


# -- dead_letter_requeue.lua ------------------------------------------------------
def dead_letter_requeue(
    dead_letter_queue: str, target: str, ids: Iterable[int] | None = None
) -> Call[int]:
    """``dead_letter_requeue.lua``: move dead letters (all when ``ids`` is None) to ``target``.

    The messages keep their IDs and start over with no deliveries counted.
    """
    validate_queue_name(dead_letter_queue)
    validate_queue_name(target)
    if target == dead_letter_queue:
        raise ValueError("the requeue target must differ from the dead-letter queue")
    if ids is None:
        selected = ["*"]
    else:
        selected = [format_id(_message_id(value)) for value in ids]
        if not selected:
            raise ValueError("name at least one message id, or None for all")
    return Call(int, "dead_letter_requeue", (dead_letter_queue, target, *selected))


def _message_id(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
        raise ValueError(f"message id must be an integer from 0 to 2**63-1, got {value!r}")
    return value


# -- worker_beat.lua --------------------------------------------------------------
#: Characters a worker id may use (it is a hash field and shown in pages).
_WORKER_ID_MAX: Final[int] = 200


def worker_beat(worker_id: str, record: Mapping[str, Any] | None, ttl_seconds: float) -> Call[int]:
    """``worker_beat.lua``: store (``record``) or remove (None) a worker's heartbeat record.

    Records whose last beat is older than ``ttl_seconds`` are dropped by the
    same script, whichever worker they belong to.
    """
    if not isinstance(worker_id, str) or not worker_id or len(worker_id) > _WORKER_ID_MAX:
        raise ValueError(f"worker id must be a string of 1 to {_WORKER_ID_MAX} characters")
    if isinstance(ttl_seconds, bool) or not isinstance(ttl_seconds, int | float):
        raise TypeError("ttl_seconds must be a number")
    ttl_us = int(ttl_seconds * 1_000_000)
    if ttl_us <= 0:
        raise ValueError("ttl_seconds must be positive")
    if record is None:
        return Call(int, "worker_beat", ("leave", worker_id, "", ttl_us))
    text = json.dumps(dict(record), separators=(",", ":"), sort_keys=True)
    return Call(int, "worker_beat", ("beat", worker_id, text, ttl_us))
