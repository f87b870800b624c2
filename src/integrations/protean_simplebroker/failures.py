"""Failed deliveries kept beside a group: one record per failure in ``<group>--failed``.

A moved message keeps its body and ID, so nothing on the message itself
can count its failed deliveries. Where the backend does not count them
(SQLite; and a Redis consumer's own redeliveries after a nack), each
failure is a record whose body is the copy's ID, in the group's
``--failed`` queue. A dead letter keeps its records (they are its delivery
count in ``dlq_list``) until it is replayed or purged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from simplebroker.ext import BrokerConnection

from .names import Layout

#: Most records read at once (only failing messages have any).
RECORD_LIMIT: Final[int] = 10_000


class FailureRecords:
    """The failure records of one broker's groups (see the module docstring)."""

    def __init__(
        self,
        layout: Layout,
        peek: Callable[[str, int], list[tuple[str, int]]],
        conn: Callable[[], BrokerConnection],
    ) -> None:
        self._layout = layout
        self._peek = peek
        self._conn = conn

    def _ids(self, queue: str, copy_id: int) -> list[int]:
        wanted = str(copy_id)
        return [record for body, record in self._peek(queue, RECORD_LIMIT) if body == wanted]

    def count(self, stream: str, group: str, copy_id: int) -> int:
        """Return how many failures of ``copy_id`` are recorded."""
        queue = self._layout.failed(stream, group)
        if not self._conn().queue_exists(queue):
            return 0
        return len(self._ids(queue, copy_id))

    def add(self, stream: str, group: str, copy_id: int, count: int = 1) -> None:
        """Record ``count`` more failures of ``copy_id``."""
        queue = self._layout.failed(stream, group)
        for _ in range(count):
            self._conn().write(queue, str(copy_id))

    def top_up(self, stream: str, group: str, copy_id: int, total: int) -> None:
        """Record failures until ``copy_id`` has ``total`` of them."""
        self.add(stream, group, copy_id, total - self.count(stream, group, copy_id))

    def drop(self, stream: str, group: str, copy_id: int) -> None:
        """Remove the records of ``copy_id`` (settled, replayed or purged)."""
        queue = self._layout.failed(stream, group)
        if self._conn().queue_exists(queue):
            ids = self._ids(queue, copy_id)
            if ids:
                self._conn().delete_message_ids(queue, ids)
