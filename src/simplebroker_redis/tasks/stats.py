"""Per task name statistics: counted in each process, kept in the server.

A producer counts the tasks it sends (``enqueued``, or ``retried`` for a
retry's new message), a worker each run it finishes (``done`` or
``failed``) with its execution time. :class:`TaskStats` adds them up in the
process per task name and minute, and every :data:`FLUSH_SECONDS` (5) sends
what it holds in one ``task_stats.lua`` call, which adds it to the
namespace's records (one per task name and minute, kept
:data:`RETENTION_MINUTES`, and one since the namespace began; see
:mod:`..taskrecord`). The server's cost is one script per process every
few seconds, shared by every task counted meanwhile, not a command per
task; the records survive a dashboard's restart, and every dashboard and
exporter reads the same ones.

What a process holds when it dies unflushed (at most one interval's
counts) is lost; a process that exits normally sends it first (``atexit``),
and one that cannot reach the server keeps it for the next try (minutes
past the retention go to the totals only). Statistics are on unless an
integration's option, or ``SIMPLEBROKER_REDIS_TASK_STATS=0``, turns them
off (:func:`enabled`).
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from collections.abc import Iterator
from typing import Final

from .. import calls
from ..calls.tasks import MAX_STATS_RECORDS
from ..runner import RedisRunner
from ..runner.base import RunnerBase
from ..runner.registry import shared_runner
from ..taskrecord import TaskRecord

logger = logging.getLogger("simplebroker_redis.tasks")

#: Seconds between a process's sends. The charts are per minute, so a few
#: seconds late is soon enough; a send costs the server about the same for
#: 10 tasks as for 100 (docs/dashboard.md), so fewer sends cost it less.
FLUSH_SECONDS: Final[float] = 5.0

#: Minutes the per-minute records are kept (Sidekiq's metrics keep 8 hours).
RETENTION_MINUTES: Final[int] = 480

#: Task names a namespace keeps records of; later new names count as ``(other)``.
MOST_NAMES: Final[int] = 500

#: Longest task name kept (characters; longer ones are cut).
NAME_CHARS: Final[int] = 200

#: Environment variable that turns statistics off (``0``, ``false``, ``off``, ``no``).
STATS_ENV: Final[str] = "SIMPLEBROKER_REDIS_TASK_STATS"

#: Environment variable that turns the task index off, the same way.
INDEX_ENV: Final[str] = "SIMPLEBROKER_REDIS_TASK_INDEX"

#: Environment variable with the seconds between sends (tests shorten it).
INTERVAL_ENV: Final[str] = "SIMPLEBROKER_REDIS_TASK_STATS_INTERVAL"

_OFF: Final[frozenset[str]] = frozenset({"0", "false", "off", "no"})


def enabled(option: bool | None, variable: str = STATS_ENV) -> bool:
    """Return whether to keep task statistics (or the task index: ``variable=INDEX_ENV``).

    An integration's explicit option wins; else the environment variable;
    else on.
    """
    if option is not None:
        return bool(option)
    return os.environ.get(variable, "").strip().lower() not in _OFF


def _interval() -> float:
    try:
        value = float(os.environ.get(INTERVAL_ENV, FLUSH_SECONDS))
    except ValueError:
        return FLUSH_SECONDS
    return value if value > 0 else FLUSH_SECONDS


class TaskStats:
    """One process's task counts for one namespace, sent to the server every few seconds."""

    def __init__(self, runner: RedisRunner, *, interval: float | None = None) -> None:
        self.runner = runner
        self.interval = _interval() if interval is None else interval
        self._lock = threading.Lock()
        self._pending: dict[tuple[int, str], TaskRecord] = {}
        self._pid = os.getpid()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._failing = False
        self.sent = 0  #: records sent so far (tests, benchmarks)

    # -- counting --------------------------------------------------------------------
    def enqueued(self, name: str, count: int = 1) -> None:
        """Count ``count`` tasks of ``name`` sent."""
        with self._lock:
            self._locked_record(name).enqueued += count

    def retried(self, name: str, count: int = 1) -> None:
        """Count ``count`` tasks of ``name`` sent again to be retried."""
        with self._lock:
            self._locked_record(name).retried += count

    def finished(self, name: str, seconds: float, *, ok: bool) -> None:
        """Count one run of ``name`` that took ``seconds``: done (``ok``) or failed."""
        with self._lock:
            record = self._locked_record(name)
            if ok:
                record.done += 1
            else:
                record.failed += 1
            record.run(seconds)

    def _locked_record(self, name: str) -> TaskRecord:
        if self._pid != os.getpid():  # a forked child counts its own tasks
            self._pid, self._pending, self._thread = os.getpid(), {}, None
            self._stop = threading.Event()
        key = (int(time.time() // 60), (name or "(unnamed)")[:NAME_CHARS])
        record = self._pending.get(key)
        if record is None:
            record = self._pending[key] = TaskRecord()
            if self._thread is None:
                self._start()
        return record

    # -- sending ---------------------------------------------------------------------
    def _start(self) -> None:
        self._thread = threading.Thread(
            target=self._run, name="simplebroker-redis-task-stats", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        stop = self._stop
        while not stop.wait(self.interval):
            self.flush()

    def _take(self) -> dict[tuple[int, str], TaskRecord]:
        with self._lock:
            taken, self._pending = self._pending, {}
        return taken

    def flush_soon(self, wait: float) -> None:
        """Send what this process counted, waiting at most ``wait`` s for the server.

        A send the server is slow to answer goes on in the background (what
        it cannot send is kept, as by :meth:`flush`): closing a connection
        after a failed publish must not wait for a network that went silent.
        """
        sender = threading.Thread(target=self.flush, name="simplebroker-redis-task-stats-flush")
        sender.daemon = True
        sender.start()
        sender.join(wait)

    def flush(self, *, final: bool = False) -> int:
        """Send what this process counted; return how many records were sent.

        What cannot be sent is kept for the next send, unless ``final`` (the
        process ends): then it is dropped, and said so at INFO level only (a
        server gone before its last producer is no news at exit).
        """
        taken = self._take()
        if not taken:
            return 0
        sent = 0
        try:
            for batch in _batches(taken):
                self.runner.run(
                    calls.task_stats(
                        batch, retention_minutes=RETENTION_MINUTES, most_names=MOST_NAMES
                    )
                )
                sent += len(batch)
        except Exception as exc:  # noqa: BLE001 - kept for the next try; counting never fails a task
            if final:
                logger.info("task statistics not sent at exit: %s", exc)
                return sent
            self._keep(list(taken.items())[sent:])
            if not self._failing:
                logger.warning("could not send task statistics (kept for the next try): %s", exc)
            self._failing = True
        else:
            self._failing = False
        self.sent += sent
        return sent

    def _keep(self, unsent: list[tuple[tuple[int, str], TaskRecord]]) -> None:
        """Put unsent records back (merged with what was counted meanwhile)."""
        with self._lock:
            for key, record in unsent:
                held = self._pending.get(key)
                if held is None:
                    self._pending[key] = record
                else:
                    held.add(record)

    def close(self) -> None:
        """Stop sending in the background, and send what is left (the process ends)."""
        self._stop.set()
        if self._pid == os.getpid():
            self.flush(final=True)


def _batches(
    records: dict[tuple[int, str], TaskRecord],
) -> Iterator[list[tuple[int, str, TaskRecord]]]:
    items = [(minute, name, record) for (minute, name), record in sorted(records.items())]
    for start in range(0, len(items), MAX_STATS_RECORDS):
        yield items[start : start + MAX_STATS_RECORDS]


_recorders: dict[str, TaskStats] = {}
_registry_lock = threading.Lock()


def task_stats(runner: RunnerBase) -> TaskStats:
    """Return this process's :class:`TaskStats` of ``runner``'s namespace (one per namespace).

    It sends through the process-wide runner of the same target and options
    (:func:`~..runner.registry.shared_runner`), not ``runner`` itself,
    which its owner may shut down before the last send.
    """
    key = repr(runner.identity)
    with _registry_lock:
        found = _recorders.get(key)
        if found is None:
            shared = shared_runner(runner.target, runner.options, runner.config)
            found = _recorders[key] = TaskStats(shared)
        return found


@atexit.register
def flush_all() -> None:
    """Send what every :class:`TaskStats` of this process holds (at exit, or a worker's end).

    Frameworks whose worker processes end without running ``atexit``
    (Celery's prefork children) call it from their own shutdown hook.
    """
    for recorder in list(_recorders.values()):
        try:
            recorder.close()
        except Exception:  # noqa: BLE001 - best effort at exit
            logger.debug("task statistics not sent at exit", exc_info=True)
