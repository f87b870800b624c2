"""Report tasks that were dead-lettered after ``max_deliveries``.

A task goes to the dead-letter queue without finishing when the lease of
its last allowed delivery expires (its worker died, or stalled past
``lease_seconds``) and a recovery moves it there, or when a worker shuts
down while running it. That happens on the server, in whichever process
runs a recovery or a reservation, and the same script records it in the
namespace's dead-letter journal (see ``docs/architecture.md``).

:class:`DeadLetterWatch` reads the journal: at start (so a dead letter made
while no worker ran is reported by the next worker to start), on every
wake-up of the dead-letter queues (every script that adds a message there
publishes one), and once a minute as a safety net. For each entry of the
queues it listens on, :func:`report_dead_letter` acknowledges the entry and
stores the task's ``DeadLetteredError`` result (``SET NX``) in one script:
of all the workers racing for an entry exactly one acknowledges it, and
that one logs the warning. The dead-letter queue itself is never consumed:
it stays the operator's to inspect and requeue.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final

from taskiq import AsyncResultBackend, TaskiqMessage, TaskiqResult
from taskiq.abc.formatter import TaskiqFormatter
from taskiq.result_backends.dummy import DummyResultBackend

from simplebroker_redis import AsyncLeases, AsyncRedisRunner, ReplicationTimeout
from simplebroker_redis.activity import AsyncActivity
from simplebroker_redis.calls.journal import JOURNAL_START
from simplebroker_redis.loop_tasks import stop_task
from simplebroker_redis.types import DeadLetterEntry, ValueWrite

from .codec import decode_body
from .errors import BACKOFF_MAX, BACKOFF_MIN, DeadLetteredError, is_transient

logger = logging.getLogger("taskiq_simplebroker")

__all__ = ["DeadLetterWatch", "report_dead_letter"]

#: Journal entries read per round trip.
PAGE: Final[int] = 256

#: Seconds between reads of the journal when no wake-up came (a safety net:
#: every dead-lettering publishes a wake-up).
SAFETY_NET: Final[float] = 60.0

Report = Callable[[DeadLetterEntry], Awaitable[None]]


class DeadLetterWatch:
    """Reports the dead-letter journal's entries of ``queues`` to ``report``."""

    def __init__(
        self,
        runner: AsyncRedisRunner,
        *,
        queues: Sequence[str],
        dead_letter_queues: Sequence[str],
        report: Report,
    ) -> None:
        self._leases = AsyncLeases(runner)
        self._queues = list(dict.fromkeys(queues))
        self._report = report
        self._wakeups = AsyncActivity(runner, list(dead_letter_queues))
        self._cursor = JOURNAL_START  #: every entry up to here was reported
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Subscribe, then report what the journal holds and watch it from then on."""
        if self._task is not None:
            return
        await self._wakeups.start()  # subscribed first: nothing added after is missed
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name="taskiq-simplebroker-dead-letters"
        )

    async def close(self, *, final_check: bool = False) -> None:
        """Stop watching (idempotent); ``final_check`` reports new entries first."""
        task, self._task = self._task, None
        await stop_task(task)  # a plain cancel() can be lost on Python 3.11
        try:
            if final_check:
                await self.check()
        except Exception as exc:  # noqa: BLE001 - shutting down: the next worker reports it
            logger.warning("could not read the dead-letter journal: %s", exc)
        finally:
            await self._wakeups.close()

    async def check(self) -> None:
        """Report every journal entry of this watch's queues after the cursor."""
        async with self._lock:
            while True:
                page = await self._leases.dead_letters(self._queues, after=self._cursor, limit=PAGE)
                for entry in page.entries:
                    await self._report(entry)
                    self._cursor = entry.entry  # reported: never again from here
                self._cursor = page.cursor
                if not page.more:
                    return

    async def _run(self) -> None:
        delay = BACKOFF_MIN
        while True:
            try:
                await self.check()
            except Exception as exc:  # noqa: BLE001 - the watch must outlive any failure
                if not is_transient(exc):
                    logger.warning("reading the dead-letter journal failed: %s", exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, BACKOFF_MAX)
                continue
            delay = BACKOFF_MIN
            await self._wakeups.wait(SAFETY_NET)


def _task_of(entry: DeadLetterEntry, formatter: TaskiqFormatter) -> TaskiqMessage | None:
    """Return the task message of a journal entry, or None (logged by the caller)."""
    if entry.body is None:
        return None
    try:
        return formatter.loads(decode_body(entry.body))
    except Exception:  # noqa: BLE001 - a foreign or damaged message
        return None


async def report_dead_letter(
    entry: DeadLetterEntry,
    *,
    runner: AsyncRedisRunner,
    formatter: TaskiqFormatter,
    backend: AsyncResultBackend[Any],
    where: str,
    max_deliveries: int | None,
) -> None:
    """Acknowledge one journal entry; if this call did, store the error result and log it.

    With a :class:`~.result_backend.SimpleBrokerResultBackend` on the same
    namespace, the acknowledgement and the result (``SET NX``: a task that
    has a result keeps it) are one script. With another backend the result
    is stored after the acknowledgement, unless the task has one; a worker
    dying in between leaves that task without it.
    """
    message = _task_of(entry, formatter)
    result: TaskiqResult[Any] | None = None
    value: ValueWrite | None = None
    if message is not None:
        error = DeadLetteredError(
            f"task {message.task_name} ({message.task_id}) went to the dead-letter queue "
            f"{entry.dead_letter_queue!r} of {where} after {entry.deliveries} deliveries "
            f"without finishing (max_deliveries={max_deliveries}): the workers running it "
            f"died or lost their leases. It is message {entry.id} there; `broker move` "
            "requeues it."
        )
        result = TaskiqResult(
            is_err=True, return_value=None, execution_time=0.0, labels=message.labels, error=error
        )
        value = _atomic_write(backend, runner, message.task_id, result)
    try:
        ack = await AsyncLeases(runner).dead_letter_ack(entry.entry, value)
    except ReplicationTimeout as exc:
        # Acknowledged on the primary: a repeat would find it taken and
        # nobody would report it.
        ack = exc.result
    if not ack.acked:
        return  # another worker reported it
    if message is None or result is None:
        state = "gone" if entry.body is None else "not a readable task"
        logger.warning(
            "message %d of queue %s went to dead-letter queue %s after %d deliveries; "
            "it is %s, so no result was stored",
            entry.id,
            entry.queue,
            entry.dead_letter_queue,
            entry.deliveries,
            state,
        )
        return
    if value is not None:
        outcome = _STORED if ack.stored else _KEPT
    else:
        outcome = await _store_after(backend, message, result)
    logger.warning(
        "task %s (%s) went to dead-letter queue %s after %d deliveries without finishing "
        "(queue %s); %s",
        message.task_name,
        message.task_id,
        entry.dead_letter_queue,
        entry.deliveries,
        entry.queue,
        outcome,
    )


def _atomic_write(
    backend: AsyncResultBackend[Any],
    runner: AsyncRedisRunner,
    task_id: str,
    result: TaskiqResult[Any],
) -> ValueWrite | None:
    """Return the result as a write for the acknowledgement script, if the backend allows."""
    writer = getattr(backend, "journal_write", None)
    if not callable(writer):
        return None
    try:
        write = writer(task_id, result, runner)
    except Exception as exc:  # noqa: BLE001 - stored after the acknowledgement instead
        logger.debug("cannot serialize the result of task %s: %s", task_id, exc)
        return None
    return write if isinstance(write, ValueWrite) else None


_STORED = "its result is an error saying so"
_KEPT = "it has a result already, kept"


async def _store_after(
    backend: AsyncResultBackend[Any], message: TaskiqMessage, result: TaskiqResult[Any]
) -> str:
    """Store ``result`` with a backend the acknowledgement could not include; say what happened."""
    if isinstance(backend, DummyResultBackend):
        return "there is no result backend to store its error in"
    try:
        if await backend.is_result_ready(message.task_id):
            return _KEPT
        await backend.set_result(message.task_id, result)
    except Exception as exc:  # noqa: BLE001 - reported in the log instead
        return f"storing its error result failed: {exc}"
    return _STORED
