"""Per-process state of a listening broker: holdings, heartbeat, commits, marks.

A :class:`Runtime` exists once per worker process and event loop; it is
built by the first ``listen()`` of that process (so ``taskiq worker
--workers N`` forks before anything is opened) and torn down by
``shutdown()``.

Taskiq's receiver runs each message in its own asyncio task: it saves the
result (``set_result``), then acknowledges the message (``ack``), in that
task. The runtime uses the task as the link between the two: a result saved
in a worker is *stashed* on the current task, and that task's ``ack`` sends
result and acknowledgement in one round trip. When no ``ack`` follows right
away (another acknowledgement mode, a middleware awaiting in between), the
stash is sent on the next loop iteration instead, so a result is never held
back. Reads of a stashed result in the same process wait for its write.
A task that called ``context.reject()`` is marked the same way, and its
acknowledgement moves the message to the dead-letter queue. Each result is
fenced by its task's reservation (:mod:`.deliveries`): a worker whose lease
was taken over cannot overwrite the result of the worker that holds the
task now.

The heartbeat thread and the dead-letter watch start only once the server
answered (:meth:`Runtime.start`), so a worker started before its server
reports the outage once instead of from every component.
"""

from __future__ import annotations

import asyncio
import logging
import os
import weakref
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from simplebroker_redis import AsyncLeases, AsyncRedisRunner, ReplicationTimeout
from simplebroker_redis.heartbeat import Holdings, LeaseHeartbeat
from simplebroker_redis.lease_timing import LeaseTiming
from simplebroker_redis.priorities import priority_queue
from simplebroker_redis.types import DeadLetterEntry

from .commit import Committer, ResultWrite
from .deadletters import DeadLetterWatch
from .deliveries import Deliveries

logger = logging.getLogger("taskiq_simplebroker")


@dataclass(slots=True)
class _Mark:
    """What the current message's task asked for before its acknowledgement."""

    writes: list[ResultWrite] = field(default_factory=list)
    reject: bool = False


class PrefetchWindow:
    """The messages one listener holds: reserved ahead, running, not yet acknowledged.

    ``size`` bounds the messages reserved *ahead* of Taskiq (fetched, not yet
    handed to it), so it is the size of a reservation; how many run at once
    is Taskiq's to bound (``taskiq worker --max-async-tasks``), since its
    receiver asks for the next message only when it has room for it.

    A message on its last allowed delivery is held *alone*: nothing more is
    reserved while it is held, and it is yielded only once every other
    message of the listener is acknowledged (see :mod:`.listener`).
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self.used = 0  #: held messages: buffered, running, not yet acknowledged
        self.alone: int | None = None  #: ID of the message held alone, if any
        self._freed = asyncio.Event()

    @property
    def room(self) -> int:
        """Return how many messages the next reservation may take (the buffer is empty)."""
        return 0 if self.alone is not None else self.size

    def take(self, count: int) -> None:
        """Account for ``count`` newly reserved messages."""
        self.used += count

    def free(self, count: int = 1) -> None:
        """Account for ``count`` messages handed back (none of them held alone)."""
        self.used -= count
        self._freed.set()

    def done(self, message_id: int) -> None:
        """Account for one message the listener is done with (acknowledged or dead-lettered)."""
        if message_id == self.alone:
            self.alone = None
        self.free()

    async def wait_for_room(self) -> None:
        """Return once at least one message may be reserved."""
        while self.room <= 0:
            await self._wait()

    async def wait_until_alone(self) -> None:
        """Return once the listener holds nothing but one message."""
        while self.used > 1:
            await self._wait()

    async def _wait(self) -> None:
        self._freed.clear()
        await self._freed.wait()


class Runtime:
    """Everything a listening broker keeps per process and event loop."""

    def __init__(
        self,
        runner: AsyncRedisRunner,
        *,
        timing: LeaseTiming,
        dead_letter_queue: str,
        sources: Sequence[tuple[str, str]],
        max_deliveries: int | None,
        on_dead_lettered: Callable[[DeadLetterEntry], Awaitable[None]],
    ) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.get_running_loop()
        self.runner = runner
        self.leases = AsyncLeases(runner)
        self.dead_letter_queue = dead_letter_queue
        self.holdings = Holdings()
        #: Which reservation holds each task started here (fences its result).
        self.deliveries = Deliveries()
        self.committer = Committer(
            runner,
            on_written=self._written,
            on_settled=self.deliveries.settled,
            busy=self.holdings.busy,
        )
        # Shown in the worker's heartbeat record: the queues, not each priority queue.
        names = [queue for queue, _ in sources]
        levels = {priority_queue(base, p) for base in names for p in range(1, 10)}
        listened = [queue for queue in names if queue not in levels]
        # The heartbeat reuses the runner's synchronous twin: its pool is
        # separate from the asyncio pool, so it gets its own connection.
        self.heartbeat = LeaseHeartbeat(
            runner.sync,
            self.holdings,
            timing,
            framework="taskiq",
            describe=lambda: {"queues": listened},
        )
        self._marks: weakref.WeakKeyDictionary[asyncio.Task[Any], _Mark] = (
            weakref.WeakKeyDictionary()
        )
        self._unwritten: dict[str, ResultWrite] = {}
        self.watch = (
            None
            if max_deliveries is None
            else DeadLetterWatch(
                runner,
                queues=[queue for queue, _ in sources],
                dead_letter_queues=[dead for _, dead in sources],
                report=on_dead_lettered,
            )
        )
        self._started = False

    async def start(self) -> None:
        """Start watching dead letters, then the heartbeat (once the server answers)."""
        if self._started:
            return
        self._started = True
        if self.watch is not None:
            # Before the heartbeat's first recovery, so its dead letters are new.
            await self.watch.start()
        self.heartbeat.start()

    def is_current(self) -> bool:
        """Return whether this runtime belongs to this process and running loop."""
        if self.pid != os.getpid():
            return False
        try:
            return asyncio.get_running_loop() is self.loop
        except RuntimeError:
            return False

    # -- acknowledgement --------------------------------------------------------
    async def ack(
        self,
        window: PrefetchWindow,
        token: str,
        message_id: int,
        dead_letter_queue: str = "",
        task_id: str | None = None,
    ) -> None:
        """Settle one delivered message, together with its task's stashed results.

        A rejected task's message goes to ``dead_letter_queue`` (that of the
        queue it came from; the runtime's own when empty). ``task_id``: the
        task the message carries, whose delivery is forgotten once the task
        that acknowledges it ends (a result saved after the acknowledgement
        still needs it).
        """
        task = asyncio.current_task()
        if task_id is not None:
            if task is None:
                self.deliveries.forget(task_id)
            else:
                forget = self.deliveries.forget
                task.add_done_callback(lambda _: forget(task_id))
        mark = self._marks.pop(task, None) if task is not None else None
        window.done(message_id)
        # Held (renewed, spared by this worker's recovery) until the
        # acknowledgement lands: a partition may hold it up past the lease.
        self.holdings.settling(token)
        try:
            if mark is None:
                await self.committer.submit((), token, message_id)
            else:
                target = (dead_letter_queue or self.dead_letter_queue) if mark.reject else ""
                await self.committer.submit(mark.writes, token, message_id, target)
        finally:
            self.holdings.settled(token)

    def settle_later(self, token: str, message_id: int, target: str) -> None:
        """Move one held message to ``target`` without waiting; let it go once that landed."""
        self.holdings.settling(token)
        done = self.committer.submit((), token, message_id, target)
        done.add_done_callback(lambda _: self.holdings.settled(token))

    def mark_rejected(self) -> None:
        """Make the current task's acknowledgement dead-letter its message."""
        task = asyncio.current_task()
        if task is not None:
            self._mark(task).reject = True

    def _mark(self, task: asyncio.Task[Any]) -> _Mark:
        mark = self._marks.get(task)
        if mark is None:
            mark = self._marks[task] = _Mark()
        return mark

    # -- results ----------------------------------------------------------------
    def stash(self, write: ResultWrite, task_id: str | None = None) -> bool:
        """Attach ``write`` to the current task's acknowledgement; False if impossible.

        ``task_id``: the task whose result ``write`` is; a task delivered
        here fences it (see :mod:`.deliveries`).
        """
        task = asyncio.current_task()
        if task is None or not self.is_current():
            return False
        if task_id is not None:
            write.fence = self.deliveries.fence(task_id)
        self._mark(task).writes.append(write)
        self._unwritten[write.key] = write
        self.loop.call_soon(self._send_stashed, task)
        return True

    def _send_stashed(self, task: asyncio.Task[Any]) -> None:
        mark = self._marks.get(task)
        if mark is None or not mark.writes:
            return
        writes, mark.writes = mark.writes, []
        if not mark.reject:
            del self._marks[task]
        self.committer.submit(writes)

    def _written(self, writes: Sequence[ResultWrite]) -> None:
        for write in writes:
            if self._unwritten.get(write.key) is write:
                del self._unwritten[write.key]

    async def written(self, key: str) -> None:
        """Wait until a result stashed in this process under ``key`` was sent."""
        write = self._unwritten.get(key)
        if write is not None and self.is_current():
            await write.wait()

    # -- handing back -------------------------------------------------------------
    async def hand_back(self, batches: Iterable[tuple[str, list[int]]], *, undeliver: bool) -> int:
        """Make held messages pending again at once; return how many."""
        released = 0
        for token, ids in batches:
            self.holdings.let_go(token, len(ids))
            for message_id in ids:
                self.deliveries.forget_message(token, message_id)
            try:
                released += await self.leases.release(token, ids, undeliver=undeliver)
            except ReplicationTimeout as exc:  # done on the primary, not on a replica yet
                released += exc.result or 0
            except Exception as exc:  # noqa: BLE001 - the lease expires instead
                logger.warning(
                    "could not hand back %d task(s), they return after their lease: %s",
                    len(ids),
                    exc,
                )
        return released

    async def close(self) -> None:
        """Send pending commits, hand back every still-held message, stop the heartbeat."""
        held: list[str] = []
        try:
            await self.committer.drain()
            held = self.holdings.tokens()
            for token in held:
                self.holdings.drop([token])
                try:
                    await self.leases.release(token)
                except Exception as exc:  # noqa: BLE001 - the lease expires instead
                    logger.warning("could not hand back reservation %s: %s", token, exc)
        finally:
            self.heartbeat.stop()
            if self.watch is not None:
                # A task on its last delivery handed back above was
                # dead-lettered: report it before the watch stops.
                await self.watch.close(final_check=bool(held))
