"""Read a namespace whole, for the metrics exporter and the dashboard.

:func:`read_namespace` takes one snapshot with ``depths.lua``: every
queue's depth per state, its oldest pending message, the dead-letter queues
of live reservations and the workers' heartbeat records, in one round trip
(``page_size`` 0) or one per ``page_size`` queues. It never sends a command
per queue. Which namespace the tools read follows the workers' rule
(:mod:`simplebroker_redis.server`, :func:`.cli.find_target`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from simplebroker_redis.calls import depths
from simplebroker_redis.runner import RedisRunner
from simplebroker_redis.types import QueueDepth, Snapshot, WorkerRecord

__all__ = [
    "DEAD_LETTER_SUFFIX",
    "DEAD_LETTER_SUFFIXES",
    "WORKER_STALE_SECONDS",
    "NamespaceState",
    "combine",
    "dead_letter_names",
    "read_namespace",
]

#: The suffix of dead-letter queue names that both integrations' docs use
#: (Taskiq's default ``<queue>.dead``; Celery's ``dead_letter_queue``).
DEAD_LETTER_SUFFIX: Final[str] = ".dead"

#: Every suffix that marks a dead-letter queue: also Dramatiq's ``<queue>.XQ``.
DEAD_LETTER_SUFFIXES: Final[tuple[str, ...]] = (DEAD_LETTER_SUFFIX, ".XQ")

#: Seconds after its last beat that a worker counts as gone.
WORKER_STALE_SECONDS: Final[float] = 30.0


@dataclass(frozen=True, slots=True)
class NamespaceState:
    """One reading of a namespace (see :func:`read_namespace`)."""

    now_us: int
    queues: tuple[QueueDepth, ...]
    dead_letter_queues: frozenset[str]  #: names among (and beyond) ``queues``
    workers: tuple[WorkerRecord, ...]  #: every heartbeat record, stale ones included
    round_trips: int
    counters: dict[tuple[str, str], int]  #: (queue, event) -> messages, kept by the scripts

    def queue(self, name: str) -> QueueDepth | None:
        """Return the depths of queue ``name`` (None when it holds nothing)."""
        for depth in self.queues:
            if depth.queue == name:
                return depth
        return None

    def live_workers(self, stale_seconds: float = WORKER_STALE_SECONDS) -> list[WorkerRecord]:
        """Return the workers whose last beat is at most ``stale_seconds`` old."""
        limit = self.now_us - int(stale_seconds * 1_000_000)
        return [worker for worker in self.workers if worker.beat_us >= limit]


def dead_letter_names(
    queues: Iterable[str], targets: Iterable[str], extra: Iterable[str] = ()
) -> frozenset[str]:
    """Return the dead-letter queues among ``queues``: by suffix, or named elsewhere."""
    named = set(targets) | set(extra)
    return frozenset({queue for queue in queues if queue.endswith(DEAD_LETTER_SUFFIXES)} | named)


def read_namespace(
    runner: RedisRunner, *, page_size: int = 0, dead_letter_queues: Iterable[str] = ()
) -> NamespaceState:
    """Read every queue of ``runner``'s namespace (sync runner)."""
    pages: list[Snapshot] = []
    cursor = ""
    while True:
        page = runner.run(depths(cursor, page_size))
        pages.append(page)
        cursor = page.cursor
        if not cursor:
            break
    return combine(pages, dead_letter_queues)


def combine(pages: list[Snapshot], dead_letter_queues: Iterable[str] = ()) -> NamespaceState:
    """Join the pages of one reading into a :class:`NamespaceState`."""
    queues = tuple(depth for page in pages for depth in page.queues)
    targets = {name for page in pages for name in page.dead_letter_targets}
    last = pages[-1]
    return NamespaceState(
        now_us=last.now_us,
        queues=queues,
        dead_letter_queues=dead_letter_names(
            (q.queue for q in queues), targets, dead_letter_queues
        ),
        workers=last.workers,
        round_trips=len(pages),
        counters=last.counters,
    )
