"""The SQLite side of the provider: SimpleBroker's public API and file locks.

A reservation is a **move**: ``move_many`` takes the oldest copies of the
group queue into ``<group>--held.<token>``, the queue of this consumer
process, in one transaction and with their IDs. Acknowledging deletes the
copy from there; a nack moves it back (same ID, so it is again the oldest
of its group). Nobody else moves a copy out of a held queue while its
consumer lives; whether it lives is an exact question on one machine,
answered by the consumer's ``flock`` (:mod:`.liveness`). Any consumer of
the group checks the other held queues of the group every
``RECOVER_SECONDS`` and moves a dead consumer's copies back.

Deliveries are counted by records in ``<group>--failed`` (one per failed
delivery: a counted nack, or a holder that died); a copy that fails its
``MAX_DELIVERIES``-th delivery goes to ``<group>--dead`` instead.

SimpleBroker pushes no wake-ups on SQLite. A blocking read sleeps on a
condition that this process's own writes signal at once, and between
those checks SQLite's ``data_version`` (a shared-memory counter that moves
when another connection commits; reading it touches no queue) with a
short back-off, which is how SimpleBroker's own watcher waits on SQLite.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Sequence
from typing import Any, Final

from simplebroker import BrokerTarget, QueueStats

from .config import Settings
from .failures import RECORD_LIMIT
from .liveness import Liveness
from .names import Layout, Parsed
from .store import Held, Store, Waiter

logger = logging.getLogger("protean_simplebroker")

#: Shortest and longest pause between data-version checks of a blocking read.
_FIRST_PAUSE: Final[float] = 0.002
_LONGEST_PAUSE: Final[float] = 0.025


class _VersionWaiter:
    """Wakes on a commit of this process (condition) or another one (data version)."""

    def __init__(self, store: SqliteStore) -> None:
        self._store = store
        self._epoch = store.epoch
        self._version = store.conn.get_data_version()

    def wait(self, timeout: float) -> bool:
        store = self._store
        deadline = time.monotonic() + max(0.0, timeout)
        pause = _FIRST_PAUSE
        while not store.stop.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            with store.changed:
                if store.epoch == self._epoch:
                    store.changed.wait(min(pause, remaining))
                if store.epoch != self._epoch:
                    self._epoch = store.epoch
                    return True
            version = store.conn.get_data_version()
            if version != self._version:
                self._version = version
                return True
            pause = min(pause * 2, _LONGEST_PAUSE)
        return False


class SqliteStore(Store):
    """A broker's SQLite file, its held queues and its liveness locks."""

    kind = "sqlite"

    def __init__(self, settings: Settings, layout: Layout) -> None:
        super().__init__(settings, layout)
        self.liveness = Liveness(settings.target)
        self.changed = threading.Condition()
        self.epoch = 0  #: bumped by every write of this process that makes work pending
        self._recovered: dict[tuple[str, str], float] = {}

    def _target(self) -> tuple[str | BrokerTarget, Any]:
        return self.settings.target, None

    def notify(self, queue: str) -> None:
        """Wake this process's blocking reads."""
        with self.changed:
            self.epoch += 1
            self.changed.notify_all()

    # -- reservations ------------------------------------------------------------
    def reserve(
        self, stream: str, group: str, limit: int, *, owned: bool
    ) -> list[tuple[Held, str]]:
        """Move up to ``limit`` oldest copies into this consumer's held queue."""
        held_queue = self.layout.held(stream, group, self.liveness.token())
        rows = self.move(self.layout.group(stream, group), held_queue, limit)
        return [(Held(stream, group, copy_id, held_queue), body) for body, copy_id in rows]

    def ack(self, held: Held) -> bool:
        """Delete the copy from the held queue (and any failure records of it)."""
        done = self.conn.delete_message_ids(held.handle, [held.copy_id]) == 1
        self.failures.drop(held.stream, held.group, held.copy_id)
        return done

    def release(self, held: Held, *, counted: bool) -> bool:
        """Move the copy back to its group, or to the dead letters past max deliveries."""
        most = self.max_deliveries
        if counted and most is not None:
            failed = self.failures.count(held.stream, held.group, held.copy_id) + 1
            if failed >= most:
                buried = self.bury(held, deliveries=failed)
                if buried:
                    logger.warning(
                        "message %s of %s dead-lettered to %s after %d deliveries",
                        held.copy_id,
                        self.layout.group(held.stream, held.group),
                        self.layout.dead(held.stream, held.group),
                        failed,
                    )
                return buried
            self.failures.add(held.stream, held.group, held.copy_id)
        group_queue = self.layout.group(held.stream, held.group)
        moved = self.move_exact(held.handle, group_queue, held.copy_id)
        if moved:
            self.notify(group_queue)
        return moved

    def _bury(self, held: Held) -> bool:
        """Move the copy to its group's dead-letter queue."""
        dead = self.layout.dead(held.stream, held.group)
        return self.move_exact(held.handle, dead, held.copy_id)

    def recorded_failures(self, held: Held) -> int:
        """Return the failure records of the copy (deliveries whose consumer died)."""
        return self.failures.count(held.stream, held.group, held.copy_id)

    def recover(self, stream: str, group: str) -> None:
        """Move the copies of the group's dead consumers back (at most every RECOVER_SECONDS)."""
        key = (stream, group)
        now = time.monotonic()
        if now < self._recovered.get(key, 0.0):
            return
        self._recovered[key] = now + self.settings.timing.recover_seconds
        mine = self.liveness.token()
        for queue in self.conn.list_queues(prefix=self.layout.held_prefix(stream, group)):
            parsed = self.layout.parse(queue)
            if parsed is None or parsed.token is None or parsed.token == mine:
                continue
            with self.liveness.dead(parsed.token) as gone:
                if gone:
                    self._recover_queue(stream, group, queue)

    def _recover_queue(self, stream: str, group: str, queue: str) -> None:
        rows = self.peek(queue, RECORD_LIMIT)
        for _, copy_id in rows:
            self.release(Held(stream, group, copy_id, queue), counted=True)
        if rows:
            logger.warning(
                "recovered %d message(s) of %s from a consumer that stopped",
                len(rows),
                self.layout.group(stream, group),
            )

    def lock(
        self, stream: str, group: str, lock_id: int
    ) -> contextlib.AbstractContextManager[bool]:
        """Hold the group's copy mutex (a file lock; ``lock_id`` is not needed here)."""
        return self.liveness.mutex(f"{self.settings.prefix}\0{stream}\0{group}")

    def deliveries(self, copy_id: int, stream: str, group: str) -> int:
        """Return the failed deliveries of a copy (at least 1)."""
        return max(1, self.failures.count(stream, group, copy_id))

    def held_count(self, queues: Sequence[tuple[Parsed, QueueStats]]) -> int:
        """Return the copies in held queues."""
        return sum(stats.pending for parsed, stats in queues if parsed.kind == "held")

    def forget_holdings(self) -> None:
        """Nothing is cached: held copies live in the file."""

    # -- wake-ups and the file ------------------------------------------------------------
    def waiter(self, queues: Sequence[str]) -> Waiter:
        """Return a waiter on this process's writes and the file's data version."""
        return _VersionWaiter(self)

    def ping(self) -> bool:
        """Return whether the file answers a read."""
        self.conn.get_data_version()
        return True

    def memory_bytes(self) -> int:
        """Return the size of the file and its write-ahead log."""
        total = 0
        for suffix in ("", "-wal"):
            with contextlib.suppress(OSError):
                total += os.path.getsize(self.settings.target + suffix)
        return total

    def hand_back_all(self) -> None:
        """Move everything this consumer holds back to its groups (graceful close)."""
        if not self.liveness.active or not self.belongs_here():
            return
        mine = self.liveness.token()
        for queue in self.conn.list_queues(prefix=self.layout.all_prefix):
            parsed = self.layout.parse(queue)
            if parsed is None or parsed.token != mine or parsed.group is None:
                continue
            target = self.layout.group(parsed.stream, parsed.group)
            while self.move(queue, target, 500):
                pass
            self.notify(target)

    def close(self) -> None:
        """Hand back what is held, release the consumer lock, close the file."""
        self.stop.set()
        if self.belongs_here():
            with contextlib.suppress(Exception):  # closing must not raise
                self.hand_back_all()
            self.liveness.close()
        super().close()
