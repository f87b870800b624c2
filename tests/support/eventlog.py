"""The event log of worker apps: one line an event, appended by any number of processes.

A line is ``<time> <pid> <kind> <words...>``; apps write it with
:func:`note`, tests read it with :func:`read_events`.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path


def append_line(path: str | os.PathLike[str], line: str) -> None:
    """Append ``line`` in one ``O_APPEND`` write: lines of several processes never mix."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def note(log: str | os.PathLike[str], kind: str, *words: object) -> None:
    """Append one event of ``kind`` (stamped with the time and this process's ID)."""
    append_line(log, " ".join(str(word) for word in (time.time(), os.getpid(), kind, *words)))


@dataclass(frozen=True)
class Event:
    """One line of the event log."""

    at: float
    pid: int
    kind: str
    words: tuple[str, ...]


def read_events(log: str | os.PathLike[str], kind: str | None = None) -> list[Event]:
    """Return the events logged so far (only those of ``kind``), in order."""
    path = Path(log)
    if not path.exists():
        return []
    events = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 3 and kind in (None, parts[2]):
            events.append(Event(float(parts[0]), int(parts[1]), parts[2], tuple(parts[3:])))
    return events
