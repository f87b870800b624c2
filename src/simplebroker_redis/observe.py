"""Read a namespace whole, for the metrics exporter and the dashboard.

:func:`open_runner` finds the server the way SimpleBroker's ``broker``
command does (an explicit target, else the ``.broker.toml`` of the working
directory or a directory above, else ``BROKER_BACKEND=redis`` with
``BROKER_BACKEND_TARGET``), so an operator points the exporter and the
dashboard at exactly what the workers use.

:func:`read_namespace` takes one snapshot with ``depths.lua``: every
queue's depth per state, its oldest pending message, the dead-letter queues
of live reservations and the workers' heartbeat records, in one round trip
(``page_size`` 0) or one per ``page_size`` queues. It never sends a command
per queue.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from simplebroker import resolve_config
from simplebroker.project import resolve_broker_target

from .aio.runner import AsyncRedisRunner
from .calls import depths
from .integration import Target
from .options import BackendOptions
from .runner import RedisRunner
from .types import QueueDepth, Snapshot, WorkerRecord

__all__ = [
    "DEAD_LETTER_SUFFIX",
    "DEAD_LETTER_SUFFIXES",
    "WORKER_STALE_SECONDS",
    "NamespaceState",
    "Target",
    "TargetError",
    "async_runner",
    "combine",
    "dead_letter_names",
    "find_target",
    "read_namespace",
    "sync_runner",
]

#: The suffix of dead-letter queue names that both integrations' docs use
#: (Taskiq's default ``<queue>.dead``; Celery's ``dead_letter_queue``).
DEAD_LETTER_SUFFIX: Final[str] = ".dead"

#: Every suffix that marks a dead-letter queue: also Dramatiq's ``<queue>.XQ``.
DEAD_LETTER_SUFFIXES: Final[tuple[str, ...]] = (DEAD_LETTER_SUFFIX, ".XQ")

#: Seconds after its last beat that a worker counts as gone.
WORKER_STALE_SECONDS: Final[float] = 30.0


class TargetError(ValueError):
    """No usable server was named (the message says what to do)."""


def find_target(
    target: str | None = None,
    namespace: str | None = None,
    *,
    directory: Path | None = None,
    options: Mapping[str, Any] | None = None,
) -> Target:
    """Return where to connect: ``target``, else the project config, as ``broker`` does.

    An explicit ``target`` never reads the project file. ``namespace`` wins
    over the project's ``[backend_options]``.

    Raises:
        TargetError: Nothing names a server, or the project's backend is not
            ``redis``.

    """
    found: Target
    if target is not None:
        found = Target(target, dict(options or {}), "--target")
    else:
        here = (directory or Path.cwd()).resolve()
        try:
            resolved = resolve_broker_target(here, config=resolve_config(env=os.environ))
        except (OSError, ValueError) as exc:
            raise TargetError(f"cannot read the SimpleBroker project config: {exc}") from exc
        if resolved is None or (resolved.backend_name == "sqlite" and resolved.config_path is None):
            raise TargetError(
                "no server named: pass --target redis://HOST:PORT/DB, or run in a directory "
                'with a .broker.toml that says backend = "redis" (or below one), or set '
                "BROKER_BACKEND=redis and BROKER_BACKEND_TARGET"
            )
        where = str(resolved.config_path or "BROKER_BACKEND")
        if resolved.backend_name != "redis":
            raise TargetError(
                f"{where} selects SimpleBroker backend {resolved.backend_name!r}, not 'redis'"
            )
        found = Target(resolved.target, {**resolved.backend_options, **(options or {})}, where)
    found = found.with_options({"namespace": namespace})
    BackendOptions.parse(found.options)  # refuse bad options before connecting
    return found


def sync_runner(target: Target) -> RedisRunner:
    """Return a runner of ``target`` (``BROKER_BACKEND_PASSWORD`` from the environment)."""
    return target.runner()


def async_runner(target: Target) -> AsyncRedisRunner:
    """Return an asyncio runner of ``target`` (one pool per event loop)."""
    return target.async_runner()


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
