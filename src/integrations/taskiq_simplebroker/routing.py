"""Routing: which SimpleBroker queue a task goes to, and the order a worker reads its queues.

A task's ``priority`` label (0 to 9, 9 first, 0 by default; RabbitMQ's
convention, which taskiq-aio-pika follows) picks a SimpleBroker queue: a
priority 0 task goes to the queue itself, priority *P* to ``<queue>.p<P>``.
So ``broker list`` shows how many tasks wait at each priority and ``broker
peek taskiq.p9`` shows the urgent ones, and a kick stays one script.

A worker listens on its queues in strict order: for each queue (in the
order given), its priority queues from ``.p9`` down to ``.p1``, then the
queue itself. One reservation takes the oldest tasks of the first of these
*sources* that has any, then of the next, up to ``prefetch``
(``reserve_queues``, one round trip). Within a priority the order is FIFO.

Queue names are taken as taskiq-redis takes them (``taskiq:queue``): each is
stored under :func:`~simplebroker_redis.queue_names.storage_queue` of it,
the mapping every integration shares (``taskiq:queue`` -> ``taskiq-3Aqueue``;
a name SimpleBroker accepts stays as it is). The broker's ``queues`` and
``dead_letter_queues`` are these stored names, the ones ``broker peek`` takes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

from simplebroker.ext import QueueNameError

from simplebroker_redis.priorities import HIGHEST, priority_queue
from simplebroker_redis.queue_names import storage_queue
from simplebroker_redis.validation import validate_queue_name

from .errors import ConfigurationError, LabelError

#: Queue Taskiq tasks go to unless a task's ``queue_name`` label says otherwise.
DEFAULT_QUEUE: Final[str] = "taskiq"


def priority_of(label: object) -> int:
    """Return the priority a ``priority`` label asks for (0 when absent).

    Raises:
        LabelError: Not an integer from 0 to 9 (labels may arrive as text:
            ``"7"`` is 7).

    """
    if label is None or label == "":
        return 0
    value: int | None = None
    if isinstance(label, int) and not isinstance(label, bool):
        value = label
    elif isinstance(label, str) and label.strip().isdigit():
        value = int(label)
    if value is None or not 0 <= value <= HIGHEST:
        raise LabelError(
            f"label 'priority' must be an integer from 0 to {HIGHEST} "
            f"({HIGHEST} runs first), got {label!r}"
        )
    return value


def label_queue(labels: Mapping[str, object], default: str, *, priorities: bool) -> str:
    """Return the SimpleBroker queue a task with ``labels`` goes to.

    ``default`` is a stored name already; a ``queue_name`` label is the
    Taskiq name, stored as :func:`storage_queue` of it.

    Raises:
        LabelError: The ``queue_name`` label is not a queue name (not text),
            or the ``priority`` label is invalid (or given to a broker with
            ``priorities=False``); the message says which and why.

    """
    label = labels.get("queue_name")
    try:
        queue = storage_queue(label) if label else default
    except QueueNameError as exc:
        raise LabelError(f"label 'queue_name' {label!r}: {exc}") from None
    priority = priority_of(labels.get("priority"))
    if not priority:
        return str(queue)
    if not priorities:
        raise LabelError("label 'priority': this broker has priorities=False")
    name = priority_queue(str(queue), priority)
    try:
        return validate_queue_name(name)
    except QueueNameError as exc:  # a queue name near the length limit
        raise LabelError(f"label 'priority' {priority}: queue {name[:40]}...: {exc}") from None


def sources(
    queues: Sequence[str], dead_letter_queues: Mapping[str, str], *, priorities: bool
) -> list[tuple[str, str]]:
    """Return the (queue, dead-letter queue) pairs a worker reserves from, in order.

    Raises:
        ConfigurationError: Two listened queues name one source (``q`` with
            priorities and ``q.p3``), a dead-letter queue is a source, or a
            priority queue's name is too long.

    """
    out: list[tuple[str, str]] = []
    for queue in queues:
        dead = dead_letter_queues[queue]
        levels = range(HIGHEST, -1, -1) if priorities else (0,)
        out += [(priority_queue(queue, level), dead) for level in levels]
    for name, _ in out:
        try:
            validate_queue_name(name)
        except ValueError as exc:  # a queue name near the length limit
            raise ConfigurationError(f"priority queue {name[:40]}...: {exc}") from exc
    names = [name for name, _ in out]
    if len(set(names)) != len(names):
        raise ConfigurationError(f"listened queues overlap: {', '.join(queues)}")
    clash = set(names) & set(dead_letter_queues.values())
    if clash:
        raise ConfigurationError(f"a dead-letter queue is also listened on: {sorted(clash)}")
    return out


def listened_queues(
    queue: str | None, queue_name: str | None, queues: Sequence[str] | None
) -> tuple[str, ...]:
    """Return the stored names of the queues given as ``queue``, ``queue_name`` or ``queues``.

    Raises:
        ConfigurationError: More than one given, or an empty ``queues``.

    """
    given = [name for name, value in (("queue", queue), ("queue_name", queue_name)) if value]
    if queues is not None:
        given.append("queues")
    if len(given) > 1:
        raise ConfigurationError(f"pass {' or '.join(given)}, not several")
    if queues is None:
        return (storage_queue(queue or queue_name or DEFAULT_QUEUE),)
    if isinstance(queues, str) or not queues:
        raise ConfigurationError("queues must be a non-empty sequence of queue names")
    return tuple(dict.fromkeys(storage_queue(name) for name in queues))
