"""The dashboard's task views: a task by its id, tasks in flight, dead letters.

Every view is a few read-only scripts, whatever the namespace holds:
``task_find.lua`` (the task index, then the result keys, in one call),
``running.lua`` and ``inspect.lua``. Nothing here knows a framework: each
message body and stored result is read by the task format of the
integration that wrote it (:mod:`simplebroker_redis.tasks.formats`).

A found task's ``state`` is one of ``pending``, ``delayed``, ``running``
(reserved: with its worker, since when, its lease deadline, and its
deliveries so far), ``dead`` (in a dead-letter queue: with its error),
``done`` or ``failed`` (its message gone: the stored result says which,
with the value or the traceback; ``claimed`` messages are done too),
``waiting`` (a Protean group has not copied it yet) and ``moved`` (stored,
in a queue none of the lookups named).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Final

from simplebroker_redis.calls import peek, running
from simplebroker_redis.calls.operations import inspect
from simplebroker_redis.calls.tasks import task_find
from simplebroker_redis.queue_names import shown_queue
from simplebroker_redis.runner import AsyncRedisRunner
from simplebroker_redis.tasks.formats import (
    Lookups,
    TaskFormat,
    TaskInfo,
    TaskOutcome,
    task_formats,
)
from simplebroker_redis.types import TaskLocation, TaskLookup

from ..observe import NamespaceState

#: Most tasks in flight a view lists (the count says how many there are).
RUNNING_SHOWN: Final[int] = 200

#: Most dead letters listed per dead-letter queue.
DEAD_SHOWN: Final[int] = 100

#: Newest messages of a progress queue read (Protean keeps at most 8).
PROGRESS_READ: Final[int] = 8

#: A location's state on the page, by where the script found its message.
_PLACES: Final[dict[str, str]] = {
    "pending": "pending",
    "delayed": "delayed",
    "reserved": "running",
    "claimed": "done",
    "moved": "moved",
    "gone": "moved",
}


def holders(reading: NamespaceState) -> dict[str, str]:
    """Return reservation token -> worker id, from the workers' heartbeat records."""
    return {
        str(token): worker.id
        for worker in reading.workers
        for token in worker.info.get("tokens", ())
    }


class Reader:
    """The task views of one namespace, as one reading of it left them."""

    def __init__(
        self,
        runner: AsyncRedisRunner,
        reading: NamespaceState,
        formats: Sequence[TaskFormat] | None = None,
    ) -> None:
        self.runner = runner
        self.reading = reading
        self.formats = tuple(task_formats() if formats is None else formats)
        self.queues = [depth.queue for depth in reading.queues]
        self.dead = reading.dead_letter_queues
        self.holders = holders(reading)

    # -- reading bodies and results -----------------------------------------------------
    def describe(self, body: str, framework: str = "") -> tuple[TaskFormat | None, TaskInfo | None]:
        """Return the format that reads ``body`` (``framework``'s first) and what it says."""
        ordered = sorted(self.formats, key=lambda f: f.framework != framework)
        for fmt in ordered:
            try:
                info = fmt.describe(body)
            except Exception:  # noqa: BLE001 - a body another program wrote: shown raw
                continue
            if info is not None:
                return fmt, info
        return None, None

    def _format(self, framework: str) -> TaskFormat | None:
        return next((f for f in self.formats if f.framework == framework), None)

    def _outcome(self, fmt: TaskFormat | None, value: str) -> TaskOutcome | None:
        if fmt is None or not value:
            return None
        try:
            return fmt.outcome(value)
        except Exception:  # noqa: BLE001 - an unreadable result is shown as none
            return None

    # -- one task, by id --------------------------------------------------------------------
    async def find(self, query: str) -> dict[str, Any]:
        """Return every message and stored outcome of the task a user named ``query``."""
        plans = [(fmt, fmt.lookups(query, self.queues)) for fmt in self.formats]
        result_keys = [
            (fmt, key) for fmt in self.formats for key in fmt.result_keys(self.runner.keys, query)
        ]
        lookup = await self._lookup(
            Lookups(
                keys=tuple(key for _, plan in plans for key in plan.keys),
                messages=tuple(pair for _, plan in plans for pair in plan.messages),
            ),
            [key for _, key in result_keys],
        )
        items = [self._located(location) for location in lookup.found]
        items += await self._followed(lookup)
        items += await self._progress(items)
        seen = {item["framework"] for item in items if item["framework"]}
        values = await self._pointed(result_keys, lookup.results)
        for (fmt, _), value in zip(result_keys, values, strict=True):
            outcome = self._outcome(fmt, value)
            found = [i for i in items if i["framework"] == fmt.framework and i["result"] is None]
            for item in found:
                item["result"] = _outcome_json(outcome)
                if item["state"] == "moved" and outcome is not None:
                    item["state"] = "done" if outcome.state == "SUCCESS" else "failed"
            if outcome is not None and fmt.framework not in seen:
                items.append(_finished(fmt.framework, query, outcome))
        return {"query": query, "now": lookup.now_us / 1e6, "tasks": _unique(items)}

    async def _pointed(
        self, result_keys: Sequence[tuple[TaskFormat, str]], values: Sequence[str]
    ) -> list[str]:
        """Return ``values`` with each one that names another key replaced by that key's value.

        One more ``task_find.lua`` round trip, only when a format's value
        names where its outcome is (:meth:`~simplebroker_redis.tasks.TaskFormat.follow`).
        """
        out = list(values)
        hops: list[tuple[int, str]] = []
        for at, ((fmt, _), value) in enumerate(zip(result_keys, values, strict=True)):
            try:
                key = fmt.follow(self.runner.keys, value) if value else None
            except Exception:  # noqa: BLE001 - an unreadable pointer: no outcome
                key, out[at] = None, ""
            if key:
                hops.append((at, key))
        if hops:
            got = await self.runner.run(task_find(result_keys=[key for _, key in hops]))
            for (at, _), value in zip(hops, got.results, strict=True):
                out[at] = value
        return out

    async def _lookup(self, lookups: Lookups, result_keys: Sequence[str] = ()) -> TaskLookup:
        call = task_find(
            lookups.keys,
            lookups.messages,
            elsewhere=sorted(self.dead),
            result_keys=result_keys,
        )
        return await self.runner.run(call)

    async def _followed(self, lookup: TaskLookup) -> list[dict[str, Any]]:
        """Look up where else the tasks found have messages (Protean's group copies)."""
        keys: list[str] = []
        for location in lookup.found:
            fmt, _ = self.describe(location.body, _framework_of(location))
            if fmt is not None and location.state != "moved":
                related = fmt.related(location.queue, location.id, self.queues)
                keys += [key for key in related.keys if f"k:{key}" != location.what]
        if not keys:
            return []
        already = {location.what for location in lookup.found}
        more = await self._lookup(Lookups(keys=tuple(k for k in keys if f"k:{k}" not in already)))
        return [self._located(location) for location in more.found]

    async def _progress(self, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Say, for each consumer of a found message without a copy of it, done or waiting."""
        out: list[dict[str, Any]] = []
        held = {item["written_to"] for item in items}
        for item in list(items):
            fmt = self._format(item["framework"])
            if fmt is None or item["message_id"] is None:
                continue
            consumers = fmt.consumers(item["queue"], self.queues)
            if consumers:
                item["state"] = "published"  # a log entry: each consumer has its own copy
            for consumer, marks in consumers:
                if consumer in held:
                    continue
                rows = await self.runner.run(peek(marks, limit=PROGRESS_READ, order="newest"))
                reached = max((fmt.progress_of(body) or 0 for body, _ in rows), default=0)
                done = reached >= int(item["message_id"])
                out.append(
                    {
                        **item,
                        "state": "done" if done else "waiting",
                        "queue": consumer,
                        "shown": shown_queue(consumer),
                        "written_to": consumer,
                        "deliveries": None,
                        "worker": "",
                        "since": None,
                        "lease_expires_in": None,
                    }
                )
        return out

    def _located(self, location: TaskLocation) -> dict[str, Any]:
        fmt, info = self.describe(location.body, _framework_of(location))
        state = _PLACES[location.state]
        if state == "pending" and location.queue in self.dead:
            state = "dead"
        now = self.reading.now_us
        item: dict[str, Any] = {
            **_info_json(fmt, info, location.id),
            "message_id": str(location.id),
            "state": state,
            "queue": location.queue or location.written_to,
            "shown": shown_queue(location.queue or location.written_to),
            "written_to": location.written_to,
            "deliveries": location.deliveries,
            "due_in": None,
            "worker": "",
            "since": None,
            "lease_expires_in": None,
            "result": None,
        }
        if location.state == "delayed" and location.until_us is not None:
            item["due_in"] = (location.until_us - now) / 1e6
        if location.state == "reserved":
            item["worker"] = self.holders.get(location.token, "")
            item["since"] = (location.reserved_us or 0) / 1e6 or None
            if location.until_us is not None:
                item["lease_expires_in"] = (location.until_us - now) / 1e6
        return item

    # -- tasks in flight ----------------------------------------------------------------------
    async def running(self, limit: int = RUNNING_SHOWN) -> dict[str, Any]:
        """Return the first ``limit`` reserved tasks, with their worker and lease, and the count."""
        got = await self.runner.run(running(limit))
        tasks = []
        for message in got.messages:
            fmt, info = self.describe(message.body)
            tasks.append(
                {
                    **_info_json(fmt, info, message.id),
                    "message_id": str(message.id),
                    "queue": message.queue,
                    "shown": shown_queue(message.queue),
                    "worker": self.holders.get(message.token, ""),
                    "since": message.reserved_us / 1e6,
                    "lease_expires_in": None
                    if message.deadline_us is None
                    else (message.deadline_us - got.now_us) / 1e6,
                    "deliveries": message.deliveries,
                }
            )
        return {"now": got.now_us / 1e6, "total": got.total, "tasks": tasks}

    # -- dead letters --------------------------------------------------------------------------
    async def dead_letters(self, limit: int = DEAD_SHOWN) -> dict[str, Any]:
        """Return each dead-letter queue's first dead letters, with task names and errors."""
        queues = []
        for name in sorted(self.dead):
            depth = self.reading.queue(name)
            if depth is None or depth.pending + depth.delayed == 0:
                continue
            queues.append(await self._dead_queue(name, depth.pending + depth.delayed, limit))
        return {"queues": queues}

    async def _dead_queue(self, name: str, count: int, limit: int) -> dict[str, Any]:
        view = await self.runner.run(inspect(name, limit, journal=True))
        journal = {entry.id: entry for entry in view.journal}
        messages = [m for part in view.states if part.state != "reserved" for m in part.messages]
        described = [self.describe(message.body) for message in messages]
        keys = [
            fmt.result_keys(self.runner.keys, info.task_id)
            if fmt is not None and info is not None and info.task_id
            else ()
            for fmt, info in described
        ]
        flat = [
            (fmt, key)
            for (fmt, _), group in zip(described, keys, strict=True)
            if fmt is not None
            for key in group
        ]
        values: Iterator[str] = iter(())
        if flat:
            read = (await self.runner.run(task_find(result_keys=[k for _, k in flat]))).results
            values = iter(await self._pointed(flat, read))
        tasks = []
        for message, (fmt, info), group in zip(messages, described, keys, strict=True):
            outcomes = [self._outcome(fmt, next(values)) for _ in group]
            outcome = next((o for o in outcomes if o is not None), None)
            entry = journal.get(message.id)
            reason = outcome.error if outcome is not None and outcome.error else ""
            if not reason:
                reason = (
                    f"delivered {entry.deliveries} times (max deliveries)"
                    if entry is not None
                    else "rejected by its worker"
                )
            tasks.append(
                {
                    **_info_json(fmt, info, message.id),
                    "message_id": str(message.id),
                    "deliveries": max(message.deliveries, entry.deliveries if entry else 0),
                    "error": reason,
                    "traceback": outcome.traceback if outcome is not None else "",
                    "source": self._source(name, fmt, info, entry.queue if entry else None),
                }
            )
        default = self._source(name, None, None, None)
        shown = shown_queue(name)
        return {"queue": name, "shown": shown, "count": count, "source": default, "tasks": tasks}

    def _source(
        self, queue: str, fmt: TaskFormat | None, info: TaskInfo | None, journaled: str | None
    ) -> str:
        """Return where a dead letter most likely came from (its retry's target)."""
        if journaled:
            return journaled
        if info is not None and info.origin:
            return info.origin
        return source_of(queue, (*((fmt,) if fmt is not None else ()), *self.formats))


def source_of(dead_letter_queue: str, formats: Sequence[TaskFormat] | None = None) -> str:
    """Return the queue ``dead_letter_queue``'s messages most likely came from ('' unknown).

    A format's answer (Dramatiq's ``<queue>.XQ``, a Protean group's), else
    the name without ``.dead``.
    """
    for candidate in task_formats() if formats is None else formats:
        try:
            found = candidate.source_queue(dead_letter_queue)
        except Exception:  # noqa: BLE001 - a format's bug: no answer
            found = None
        if found:
            return found
    if dead_letter_queue.endswith(".dead"):
        return dead_letter_queue.removesuffix(".dead")
    return ""


def _framework_of(location: TaskLocation) -> str:
    """Return the framework a task index key names (``k:<framework>:...``), else ''."""
    if location.what.startswith("k:"):
        return location.what[2:].partition(":")[0]
    return ""


def _info_json(fmt: TaskFormat | None, info: TaskInfo | None, message_id: int) -> dict[str, Any]:
    if info is None:
        return {"framework": fmt.framework if fmt else "", "task_id": str(message_id), "name": ""}
    return {
        "framework": info.framework,
        "task_id": info.task_id or str(message_id),
        "name": info.name,
        "preview": info.preview,
    }


def _outcome_json(outcome: TaskOutcome | None) -> dict[str, str] | None:
    if outcome is None:
        return None
    return {
        "state": outcome.state,
        "result": outcome.result,
        "error": outcome.error,
        "traceback": outcome.traceback,
    }


def _finished(framework: str, task_id: str, outcome: TaskOutcome) -> dict[str, Any]:
    """Return a task whose message is gone and whose outcome is stored."""
    return {
        "framework": framework,
        "task_id": task_id,
        "name": "",
        "message_id": None,
        "state": "done" if outcome.state == "SUCCESS" else "failed",
        "queue": "",
        "written_to": "",
        "deliveries": None,
        "due_in": None,
        "worker": "",
        "since": None,
        "lease_expires_in": None,
        "result": _outcome_json(outcome),
    }


def _unique(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Return ``items`` without repeats (a message found by its key and by its ID)."""
    out, seen = [], set()
    for item in items:
        key = (item["message_id"], item["queue"], item["state"])
        if item["message_id"] is None or key not in seen:
            seen.add(key)
            out.append(item)
    return out
