"""Sending a kicked task: one write, idempotent by the task's ID and content.

``kiq()`` writes a task as one SimpleBroker message (``write_batch.lua``,
group-committed with the loop's other kicks). The write carries an
idempotency key, :func:`dedupe_key`: the task's ID and a digest of its
content, kept ``dedupe_seconds`` (600 by default). The same task sent
again within that window (``task.kicker().with_task_id(id).kiq(...)``
with the same arguments, after ``kiq()`` failed with
:class:`~.errors.TaskOutcomeUnknown`) stores nothing more. Taskiq's retry
middlewares send a failed task again under its ID with another
``_retries`` label: another key, so stored. A scheduler's run (label
``schedule_id``) gets no key: a schedule may give every run one task ID.

A write whose reply never came (the request left, then ``socket_timeout``,
10 s by default, or a cut connection) raises ``TaskOutcomeUnknown``, which
``kiq()`` turns into the cause of Taskiq's ``SendTaskError``.
"""

from __future__ import annotations

import hashlib
import re
from typing import Final

from taskiq.message import BrokerMessage

from simplebroker_redis import AsyncMessages, OutcomeUnknown
from simplebroker_redis.calls import DEFAULT_DEDUPE_SECONDS
from simplebroker_redis.validation import number_problem

from .codec import encode_body
from .errors import LabelError, TaskOutcomeUnknown

#: A task ID usable as it is in an idempotency key.
_KEY_SAFE: Final = re.compile(r"^[!-~]{1,150}$")


def delay_seconds(label: object) -> float:
    """Return the seconds of a ``delay`` label (str or number; negative means now)."""
    if label is None or label == "":
        return 0.0
    try:
        delay = float(label)  # type: ignore[arg-type] # labels arrive as str or number
    except (TypeError, ValueError):
        raise LabelError(f"label 'delay' must be seconds, got {label!r}") from None
    if number_problem(delay) is not None:
        raise LabelError(f"label 'delay' must be finite, got {label!r}")
    return max(0.0, delay)


def dedupe_key(message: BrokerMessage) -> str | None:
    """Return the idempotency key of a kicked task (see the module docstring), or None."""
    if "schedule_id" in message.labels:
        return None
    digest = hashlib.sha256(message.message).hexdigest()[:24]
    task_id = message.task_id
    if _KEY_SAFE.match(task_id):
        return f"{task_id}:{digest}"
    raw = task_id.encode("utf-8", "surrogatepass") + b"\0" + message.message
    return hashlib.sha256(raw).hexdigest()


async def send(
    messages: AsyncMessages,
    queue: str,
    message: BrokerMessage,
    delay: float,
    *,
    task_key: str,
    dedupe: float | None,
) -> None:
    """Write ``message`` to ``queue`` (``dedupe``: its key's seconds, None for no key).

    Raises:
        TaskOutcomeUnknown: The write was sent but its reply never came.

    """
    try:
        await messages.write(
            queue,
            encode_body(message.message),
            delay_seconds=delay,
            task_key=task_key,
            dedupe_key=None if dedupe is None else dedupe_key(message),
            dedupe_seconds=dedupe or DEFAULT_DEDUPE_SECONDS,
        )
    except OutcomeUnknown as exc:
        raise TaskOutcomeUnknown.of(message.task_id, dedupe, exc) from exc
