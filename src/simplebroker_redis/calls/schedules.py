"""Taskiq's room: the schedule source's calls (claim a due run, confirm it was sent, list them).

Its scripts are ``lua/taskiq/schedule_*.lua``; its reply types are here.
(Its keys, ``schedules``, ``schedule_runs`` and ``schedule_claims``, are
fixed keys of every namespace: see :mod:`simplebroker_redis.keys`.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from .base import Call, lease_microseconds, parse_bool

#: Which run of a Taskiq schedule ``schedule_claim.lua`` claims.
ScheduleKind = Literal["time", "cron", "interval", "retry"]


@dataclass(frozen=True, slots=True)
class LostRun:
    """A claimed schedule run whose claim expired unsent (its scheduler died)."""

    schedule_id: str
    run: str  #: the run's name (give it to ``schedule_claim(..., "retry", run)``)
    schedule: str  #: the schedule's JSON when it was claimed
    claimed_us: int  #: when it was first claimed (server time, microseconds)


@dataclass(frozen=True, slots=True)
class ScheduleTable:
    """The stored schedules, and the claimed runs that were lost."""

    schedules: dict[str, str]  #: schedule id -> JSON
    lost: tuple[LostRun, ...]


def _claimed(raw: Any) -> str | None:
    return str(raw[0]) if raw else None


def schedule_claim(
    schedule_id: str, kind: ScheduleKind, run: str | int, lease_seconds: float
) -> Call[str | None]:
    """``schedule_claim.lua``: claim one due run of a schedule; its name, or None if not ours.

    ``run`` is the minute (since the epoch, UTC) for ``cron``, the interval
    in microseconds for ``interval``, the lost run's name for ``retry`` and
    ignored for ``time``.
    """
    if kind not in ("time", "cron", "interval", "retry"):
        raise ValueError(f"unknown schedule kind {kind!r}")
    lease = lease_microseconds(lease_seconds)
    if lease <= 0:
        raise ValueError("lease_seconds must be > 0")
    text = "" if kind == "time" else str(run)
    return Call(_claimed, "schedule_claim", (schedule_id, kind, text, lease))


def schedule_sent(schedule_id: str, run: str) -> Call[bool]:
    """``schedule_sent.lua``: confirm a claimed run was sent; False if its claim was gone."""
    return Call(parse_bool, "schedule_sent", (schedule_id, run))


def _table(raw: Any) -> ScheduleTable:
    stored, lost = raw
    return ScheduleTable(
        schedules={str(stored[i]): str(stored[i + 1]) for i in range(0, len(stored), 2)},
        lost=tuple(
            LostRun(str(lost[i]), str(lost[i + 1]), str(lost[i + 2]), int(lost[i + 3]))
            for i in range(0, len(lost), 4)
        ),
    )


def schedule_list() -> Call[ScheduleTable]:
    """``schedule_list.lua``: every stored schedule, and the runs claimed but never sent."""
    return Call(_table, "schedule_list", (), idempotent=True)
