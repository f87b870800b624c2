"""Which reservation holds each task a worker started: the fence of its result.

A worker whose lease was taken over (it was stopped, or cut off from the
server, past its lease, and another worker recovered and ran the task)
must not overwrite the result of the worker that holds the task now. So a
result written while its task's message is still held is *fenced* by that
reservation: ``commit.lua`` stores it only while the token still holds the
message. A result written after this worker's own acknowledgement of the
message was accepted (Taskiq's ``ack_type`` ``when_received`` or
``when_executed``) is the result of the worker that settled the task:
it is stored as it is. One whose acknowledgement was refused keeps its
fence, and is refused too.

Taskiq names a task's result by task ID only, so the listener records
each delivered message under the task ID its body carries
(:func:`task_id_of`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final

#: Most deliveries remembered: a task whose callback never acknowledged
#: (it crashed in a middleware) is forgotten after this many newer ones.
LIMIT: Final[int] = 10_000

#: How Taskiq's JSON formatter starts a message: the task ID first.
_JSON_TASK_ID: Final = re.compile(rb'^\s*\{\s*"task_id"\s*:\s*"([^"\\]{1,200})"')


def task_id_of(data: bytes, parse: Callable[[bytes], str] | None = None) -> str | None:
    """Return the task ID of a message's bytes, None when it cannot be read.

    Taskiq's JSON formatter writes ``{"task_id": ...`` first: read without
    parsing the rest. Anything else goes to ``parse`` (the broker's
    formatter), when given.
    """
    found = _JSON_TASK_ID.match(data)
    if found is not None:
        return found.group(1).decode("utf-8", "replace")
    if parse is None:
        return None
    try:
        return parse(data)
    except Exception:  # noqa: BLE001 - not a task: the receiver reports it
        return None


@dataclass(slots=True)
class Delivery:
    """One delivered message: its reservation, and whether its acknowledgement held."""

    token: str
    message_id: int
    settled: bool | None = None  #: None held; True acknowledged here; False refused


class Deliveries:
    """The deliveries of one worker process and event loop, by task ID."""

    def __init__(self, limit: int = LIMIT) -> None:
        self._limit = limit
        self._by_task: dict[str, Delivery] = {}
        self._by_message: dict[tuple[str, int], str] = {}

    def add(self, task_id: str, token: str, message_id: int) -> None:
        """Record that the message ``message_id`` of ``token`` carries task ``task_id``."""
        self.forget(task_id)
        while len(self._by_task) >= self._limit:
            self.forget(next(iter(self._by_task)))
        self._by_task[task_id] = Delivery(token, message_id)
        self._by_message[(token, message_id)] = task_id

    def fence(self, task_id: str) -> tuple[str, int] | None:
        """Return the (token, message ID) a result of ``task_id`` is fenced by, or None.

        None: stored as it is (a task not delivered here, or one whose
        acknowledgement here was accepted).
        """
        delivery = self._by_task.get(task_id)
        if delivery is None or delivery.settled:
            return None
        return (delivery.token, delivery.message_id)

    def settled(self, token: str, message_ids: Iterable[int], accepted: bool) -> None:
        """Record how the acknowledgement of ``message_ids`` of ``token`` went."""
        for message_id in message_ids:
            task_id = self._by_message.get((token, message_id))
            if task_id is not None:
                self._by_task[task_id].settled = accepted

    def forget(self, task_id: str) -> None:
        """Forget a task's delivery (its callback ended, or it was handed back)."""
        delivery = self._by_task.pop(task_id, None)
        if delivery is not None:
            self._by_message.pop((delivery.token, delivery.message_id), None)

    def forget_message(self, token: str, message_id: int) -> None:
        """Forget the delivery of one message (handed back before it ran)."""
        task_id = self._by_message.get((token, message_id))
        if task_id is not None:
            self.forget(task_id)

    def __len__(self) -> int:
        return len(self._by_task)
