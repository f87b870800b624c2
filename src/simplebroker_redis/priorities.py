"""Priority queues: where a message of a given priority is stored, and the read order.

A message of priority 0 (the default) stays in its queue; priority *P*
(1 to :data:`HIGHEST`, the highest runs first, RabbitMQ's convention) goes
to the queue ``<queue>.p<P>``. A consumer reserves from ``.p9`` down to
``.p1``, then the queue itself, in strict order and one round trip
(``reserve_queues``); within a priority the order is FIFO. So ``broker
list`` shows how many messages wait at each priority, and a write stays one
script. The Taskiq and Celery integrations both store priorities this way.
"""

from __future__ import annotations

from typing import Final

from .validation import validate_queue_name

#: Highest priority; priorities are 0..HIGHEST and the highest is read first.
HIGHEST: Final[int] = 9


def priority_queue(queue: str, priority: int) -> str:
    """Return the queue that stores ``queue``'s messages of ``priority`` (0: ``queue``)."""
    return queue if priority == 0 else f"{queue}.p{priority}"


def levels(queue: str) -> tuple[str, ...]:
    """Return ``queue``'s priority queues in read order: ``.p9`` ... ``.p1``, then ``queue``.

    Raises:
        ValueError: A priority queue's name would be too long.

    """
    return tuple(
        validate_queue_name(priority_queue(queue, level)) for level in range(HIGHEST, -1, -1)
    )
