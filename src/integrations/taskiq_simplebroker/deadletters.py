"""Notice tasks that were dead-lettered after ``max_deliveries``.

A task goes to the dead-letter queue without finishing when the lease of
its last allowed delivery expires (its worker died, or stalled past
``lease_seconds``) and a recovery moves it there, or when a worker shuts
down while running it. The recovery runs on the server (in any process's
``recover`` or at the start of any reservation) and reports only counts, so
no worker learns the IDs from it.

:class:`DeadLetterWatch` finds them instead: it subscribes to the
dead-letter queue's wake-up channel (every script that adds a message there
publishes on it), takes note of the IDs already in the queue, and on every
wake-up compares the queue with that note. A new message whose delivery
count reached ``max_deliveries`` is reported to ``on_dead_lettered``. The
queue is never consumed: it stays the operator's to inspect and requeue.

Each worker process watches, so a task dead-lettered while any worker runs
is reported by each of them; the receiver of the report (the broker) writes
the task's error result only if it has none, so one of them logs it. A dead
letter made while no worker runs is not reported. The exact fix is on the
backend side: a ``recover``/``release`` reply that lists the dead-lettered
IDs would feed ``on_dead_lettered`` directly.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final, cast

from taskiq import AsyncResultBackend, TaskiqResult
from taskiq.abc.formatter import TaskiqFormatter
from taskiq.result_backends.dummy import DummyResultBackend

from simplebroker_redis.aio import AsyncActivity, AsyncLeases, AsyncRedisRunner
from simplebroker_redis.core import RedisBrokerCore

from .codec import decode_body
from .errors import BACKOFF_MAX, BACKOFF_MIN, DeadLetteredError, is_transient

logger = logging.getLogger("taskiq_simplebroker")

Row = tuple[str, int]

#: Messages read per peek while comparing the dead-letter queue.
PAGE: Final[int] = 500


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A task message that reached the dead-letter queue after ``max_deliveries``."""

    queue: str  #: the queue the worker listens on
    dead_letter_queue: str
    message_id: int
    body: str  #: the stored message body (see :mod:`.codec`)
    deliveries: int


class DeadLetterWatch:
    """Reports new dead letters of one dead-letter queue to ``on_dead_lettered``."""

    def __init__(
        self,
        runner: AsyncRedisRunner,
        *,
        queue: str,
        dead_letter_queue: str,
        max_deliveries: int,
        on_dead_lettered: Callable[[DeadLetter], Awaitable[None]],
    ) -> None:
        self._runner = runner
        self._leases = AsyncLeases(runner)
        self._queue = queue
        self._dead_letter_queue = dead_letter_queue
        self._max_deliveries = max_deliveries
        self._on_dead_lettered = on_dead_lettered
        self._wakeups = AsyncActivity(runner, [dead_letter_queue])
        self._known: set[int] | None = None  #: IDs in the queue at the last look
        self._core: RedisBrokerCore | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Subscribe, note what the queue holds now, and watch it from then on."""
        if self._task is not None:
            return
        await self._wakeups.start()  # subscribed first: nothing added after is missed
        try:
            self._known = set(await self._read())
        except Exception as exc:  # noqa: BLE001 - the first wake-up takes the note then
            logger.debug("reading %s failed: %s", self._dead_letter_queue, exc)
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name="taskiq-simplebroker-dead-letters"
        )

    async def close(self) -> None:
        """Stop watching (idempotent)."""
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)
        await self._wakeups.close()

    async def check(self) -> None:
        """Compare the queue with the last note and report new dead letters."""
        current = await self._read()
        known, self._known = self._known, set(current)
        if known is None:
            return  # the first complete look is the note
        for message_id in sorted(set(current) - known):
            deliveries = await self._leases.deliveries(message_id)
            if deliveries >= self._max_deliveries:
                await self._on_dead_lettered(
                    DeadLetter(
                        self._queue,
                        self._dead_letter_queue,
                        message_id,
                        current[message_id],
                        deliveries,
                    )
                )

    async def _run(self) -> None:
        while True:
            # A wake-up per addition to the queue (and one after every
            # reconnect); the hourly look is only a safety net.
            await self._wakeups.wait(3600.0)
            delay = BACKOFF_MIN
            while True:
                try:
                    await self.check()
                    break
                except Exception as exc:  # noqa: BLE001 - the watch must outlive any failure
                    if not is_transient(exc):
                        logger.warning("checking %s failed: %s", self._dead_letter_queue, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, BACKOFF_MAX)

    async def _read(self) -> dict[int, str]:
        """Return ID -> body of every message in the dead-letter queue."""
        return await asyncio.to_thread(self._read_sync)

    def _read_sync(self) -> dict[int, str]:
        # SimpleBroker's own peek, on the runner's synchronous twin (its own
        # pool): a rare read, so a thread hop costs nothing that matters.
        if self._core is None:
            self._core = RedisBrokerCore(self._runner.sync)
        rows = self._core.peek_generator(self._dead_letter_queue, batch_size=PAGE)
        return {message_id: body for body, message_id in cast("Iterator[Row]", rows)}


async def cancel_and_wait(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` and wait until it ended, cancelling again if a cancel was lost.

    A cancellation that meets a wake-up at the same moment can be lost on
    Python 3.11 (seen here: the watch went back to sleep for an hour with
    the cancel pending, and shutdown hung); so wait in slices and repeat.
    """
    task.cancel()
    while not task.done():
        await asyncio.wait({task}, timeout=1.0)
        if not task.done():
            task.cancel()
    if not task.cancelled() and task.exception() is not None:
        logger.debug("the dead-letter watch ended with %r", task.exception())


async def report_dead_letter(
    dead: DeadLetter,
    *,
    formatter: TaskiqFormatter,
    backend: AsyncResultBackend[Any],
    where: str,
    max_deliveries: int | None,
) -> None:
    """Store an error result for a dead-lettered task unless it has one; log it if stored.

    Every watching worker calls this for the same task; the result is
    written only where none exists, so one worker logs the warning. A broker
    without a result backend cannot store it, and every worker logs.
    """
    try:
        message = formatter.loads(decode_body(dead.body))
    except Exception as exc:  # noqa: BLE001 - a foreign or damaged message
        logger.warning(
            "message %d in %s is not a readable task: %s",
            dead.message_id,
            dead.dead_letter_queue,
            exc,
        )
        return
    error = DeadLetteredError(
        f"task {message.task_name} ({message.task_id}) went to the dead-letter queue "
        f"{dead.dead_letter_queue!r} of {where} after {dead.deliveries} deliveries without "
        f"finishing (max_deliveries={max_deliveries}): the workers running it died or "
        f"lost their leases. It is message {dead.message_id} there; `broker move` requeues it."
    )
    result: TaskiqResult[Any] = TaskiqResult(
        is_err=True, return_value=None, execution_time=0.0, labels=message.labels, error=error
    )
    if not await _store_once(backend, message.task_id, result):
        return
    logger.warning(
        "task %s (%s) went to dead-letter queue %s after %d deliveries without finishing "
        "(queue %s); its result is an error saying so",
        message.task_name,
        message.task_id,
        dead.dead_letter_queue,
        dead.deliveries,
        dead.queue,
    )


async def _store_once(
    backend: AsyncResultBackend[Any], task_id: str, result: TaskiqResult[Any]
) -> bool:
    """Store ``result`` unless the task has one; True when this call stored it."""
    if isinstance(backend, DummyResultBackend):
        return True  # nothing to store: every worker that notices logs it
    if_absent = getattr(backend, "set_result_if_absent", None)
    if callable(if_absent):
        return bool(await if_absent(task_id, result))
    if await backend.is_result_ready(task_id):
        return False
    await backend.set_result(task_id, result)
    return True
