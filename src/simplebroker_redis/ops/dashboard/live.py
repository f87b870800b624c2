"""The dashboard's live state: one reader per server, fanned out to every page.

:class:`LiveState` reads the namespace (``depths.lua``, one round trip)
whenever a queue's wake-up channel hears something (every script that
makes a message pending, delayed or released publishes there; see
:mod:`simplebroker_redis.activity.aio`), and at least every ``refresh`` seconds, for what
publishes nothing (acknowledgements, new queues, workers' beats). Each
reading that differs from the last goes to every connected page as a
server-sent event (``state``); pages never poll. Readings are at most
``min_gap`` seconds apart, so a burst of wake-ups costs one read.

With a reading, at most once a second, go the tasks in flight
(``running.lua``) and, read at most every 2.5 s, the last hour of task
statistics (``task_stats_read.lua``): a ``tasks`` event when they changed,
so the page's "running now" and its task charts follow without a reload.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any, Final

from simplebroker_redis.activity import AsyncActivity
from simplebroker_redis.calls import depths
from simplebroker_redis.calls.tasks import task_stats_read
from simplebroker_redis.queue_names import shown_queue
from simplebroker_redis.runner import AsyncRedisRunner
from simplebroker_redis.types import Snapshot

from ..observe import NamespaceState, combine
from ..task_summary import names_table, series
from .tasks import Reader, source_of

logger = logging.getLogger("simplebroker_redis.dashboard")

#: Seconds between readings when nothing wakes the reader.
REFRESH_SECONDS: Final[float] = 2.0

#: Least seconds between two readings (a burst of wake-ups is one read).
MIN_GAP_SECONDS: Final[float] = 0.25

#: Events a slow page may fall behind by before it misses some.
CLIENT_BACKLOG: Final[int] = 8

#: Least seconds between two readings of the tasks in flight.
TASKS_GAP_SECONDS: Final[float] = 1.0

#: Least seconds between two readings of the task statistics: processes send
#: theirs every 5 s, and an hour of records of many task names is not small.
STATS_GAP_SECONDS: Final[float] = 2.5

#: Tasks in flight a ``tasks`` event lists.
RUNNING_SENT: Final[int] = 100

#: Minutes of task statistics a ``tasks`` event carries.
STATS_MINUTES: Final[int] = 60

#: One event for a page: (event name, JSON data).
Event = tuple[str, str]


async def read_state(runner: AsyncRedisRunner, page_size: int = 0) -> NamespaceState:
    """Read the namespace with the asyncio runner (see :func:`..observe.read_namespace`)."""
    pages: list[Snapshot] = []
    cursor = ""
    while True:
        page = await runner.run(depths(cursor, page_size))
        pages.append(page)
        cursor = page.cursor
        if not cursor:
            return combine(pages)


def state_json(state: NamespaceState, namespace: str) -> dict[str, Any]:
    """Return what a page is sent of one reading (never the target or its password)."""
    holders: dict[str, str] = {}
    for worker in state.workers:
        for token in worker.info.get("tokens", ()):
            holders[str(token)] = worker.id
    counters: dict[str, dict[str, int]] = {}
    for (queue, event), value in state.counters.items():
        counters.setdefault(queue, {})[event] = value
    queues = []
    for depth in state.queues:
        dead = depth.queue in state.dead_letter_queues
        age = None
        if depth.oldest_pending_us is not None:
            age = max(0.0, (state.now_us - depth.oldest_pending_us) / 1e6)
        queues.append(
            {
                "name": depth.queue,
                # A framework's name stored escaped (taskiq:queue), as its users wrote it.
                "shown": shown_queue(depth.queue),
                "pending": depth.pending,
                "reserved": depth.reserved,
                "delayed": depth.delayed,
                "claimed": depth.claimed,
                "oldest_age": age,
                "dead_letter": dead,
                # Where "retry all" sends a dead-letter queue's messages ('' unknown).
                "source": source_of(depth.queue) if dead else "",
                "counters": counters.get(depth.queue, {}),
            }
        )
    live = {worker.id for worker in state.live_workers()}
    workers = [
        {
            "id": worker.id,
            "beat_age": max(0.0, (state.now_us - worker.beat_us) / 1e6),
            "live": worker.id in live,
            **{k: v for k, v in worker.info.items() if k != "tokens"},
        }
        for worker in sorted(state.workers, key=lambda w: w.id)
    ]
    return {
        "namespace": namespace,
        "now": state.now_us / 1e6,
        "queues": queues,
        "dead_letter_queues": sorted(state.dead_letter_queues),
        "workers": workers,
        "holders": holders,
        "totals": _totals(counters),
    }


async def stats_json(runner: AsyncRedisRunner, reading: NamespaceState) -> dict[str, Any]:
    """Return the last hour's task statistics as a ``tasks`` event carries them."""
    last = reading.now_us // 60_000_000
    first = last - STATS_MINUTES + 1
    page = await runner.run(task_stats_read(first, last))
    return {**series(page, first, last), "names": names_table(page)}


def _totals(counters: dict[str, dict[str, int]]) -> dict[str, int]:
    totals: dict[str, int] = {}
    for events in counters.values():
        for event, value in events.items():
            totals[event] = totals.get(event, 0) + value
    return totals


class LiveState:
    """Reads the namespace on wake-ups and sends each new reading to every subscriber."""

    def __init__(
        self,
        runner: AsyncRedisRunner,
        *,
        refresh: float = REFRESH_SECONDS,
        min_gap: float = MIN_GAP_SECONDS,
    ) -> None:
        self._runner = runner
        self._refresh = refresh
        self._min_gap = min_gap
        self._subscribers: set[asyncio.Queue[Event]] = set()
        self._task: asyncio.Task[None] | None = None
        self._kick = asyncio.Event()
        self.last: str | None = None  #: the last state event's data (JSON)
        self.last_tasks: str | None = None  #: the last tasks event's data (JSON)
        self._tasks_read = self._stats_read = 0.0
        self._stats: dict[str, Any] = {}
        self.reads = 0  #: readings made (tests)

    def subscribe(self) -> asyncio.Queue[Event]:
        """Return a queue of events for one page (the last readings first)."""
        queue: asyncio.Queue[Event] = asyncio.Queue(CLIENT_BACKLOG)
        if self.last is not None:
            queue.put_nowait(("state", self.last))
        if self.last_tasks is not None:
            queue.put_nowait(("tasks", self.last_tasks))
        self._subscribers.add(queue)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="dashboard-live")
        return queue

    def unsubscribe(self, queue: asyncio.Queue[Event]) -> None:
        """Stop sending events to ``queue``."""
        self._subscribers.discard(queue)

    def changed(self) -> None:
        """Read again at once (after an action of the dashboard itself)."""
        self._kick.set()

    async def close(self) -> None:
        """Stop reading."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _run(self) -> None:
        activity: AsyncActivity | None = None
        watched: tuple[str, ...] = ()
        loop = asyncio.get_running_loop()
        try:
            while True:
                started = loop.time()
                try:
                    state = await read_state(self._runner)
                    self.reads += 1
                    names = tuple(sorted(q.queue for q in state.queues))
                    if names and names != watched:
                        if activity is not None:
                            await activity.close()
                        activity = AsyncActivity(self._runner, names)
                        await activity.start()
                        watched = names
                    self._publish(json.dumps(state_json(state, self._runner.keys.namespace)))
                    if loop.time() - self._tasks_read >= TASKS_GAP_SECONDS:
                        await self._read_tasks(state, loop.time())
                except Exception as exc:  # noqa: BLE001 - the reader outlives outages
                    logger.warning("could not read the namespace: %s", exc)
                    self._publish(json.dumps({"error": "the server could not be read"}))
                await asyncio.sleep(max(0.0, self._min_gap - (loop.time() - started)))
                await self._wait(activity)
        finally:
            if activity is not None:
                await activity.close()

    async def _read_tasks(self, state: NamespaceState, now: float) -> None:
        """Publish the tasks in flight, and the statistics read at most every few seconds."""
        self._tasks_read = now
        if now - self._stats_read >= STATS_GAP_SECONDS:
            self._stats_read = now
            self._stats = await stats_json(self._runner, state)
        running = await Reader(self._runner, state).running(RUNNING_SENT)
        self._publish(json.dumps({"running": running, "stats": self._stats}), "tasks")

    async def _wait(self, activity: AsyncActivity | None) -> None:
        """Return on a wake-up, an action of the dashboard, or after ``refresh`` seconds."""
        self._kick.clear()
        waits: list[asyncio.Future[bool]] = [asyncio.ensure_future(self._kick.wait())]
        if activity is not None:
            waits.append(asyncio.ensure_future(activity.wait(self._refresh)))
        done, pending = await asyncio.wait(
            waits, timeout=self._refresh, return_when=asyncio.FIRST_COMPLETED
        )
        for task in pending:
            task.cancel()
        del done

    def _publish(self, data: str, kind: str = "state") -> None:
        if kind == "state":
            if data == self.last:
                return
            self.last = data
        else:
            if data == self.last_tasks:
                return
            self.last_tasks = data
        for queue in list(self._subscribers):
            if queue.full():  # a page that stopped reading gets the newest events only
                with contextlib.suppress(asyncio.QueueEmpty):
                    queue.get_nowait()
            queue.put_nowait((kind, data))
