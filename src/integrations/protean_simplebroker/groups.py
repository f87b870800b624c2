"""Consumer groups: registration, copying the log into each group, retention.

Publishing writes a message once, to its stream's log. Each group *pulls*:
before a consumer of the group reserves, it copies log entries newer than
the group's position into the group queue, in log order. A batch of copies
and the new position (a record in the group's ``--at`` queue) are one
atomic step: one ``insert_messages`` of all of them, with IDs of their own
(:func:`copy_ids`), all written or none. Copying holds the group's copy lock (a lease on the
group's registration message on Redis, a file lock on SQLite), so two
consumers never copy the same entry; a consumer that dies while copying
leaves a position that matches exactly what it copied.

So every group gets every message of its stream, from the oldest kept in
the log (a group created late still gets the history, as with Redis
Streams' ``XGROUP CREATE ... 0``), and the consumers of a group share the
group queue.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

from simplebroker.ext import IntegrityError

from .messages import envelope, is_registration, position_of, position_record, registration
from .names import SEP, Layout
from .store import Store
from .taskformat import copy_key

logger = logging.getLogger("protean_simplebroker")

#: Newest messages of an ``--at`` queue read to find the position.
_POSITION_SCAN = 8

#: Records an ``--at`` queue holds before the older ones are deleted.
_PRUNE_AT = 8

#: Tries of one copy when IDs collide (practically never; see copy_ids).
_INSERT_ATTEMPTS = 5

#: SimpleBroker IDs: a nanosecond clock whose low 12 bits are a counter.
_GRAIN_BITS = 12
_HALF = 1 << (_GRAIN_BITS - 1)


def copy_ids(after: int, count: int) -> list[int]:
    """Return ``count`` increasing message IDs above ``after`` for one copy batch.

    They are the upper halves (counter >= 2048) of the clock grains after
    ``after``'s: writers take a grain's counters from 0 up, one per message
    in the same 4 us (or, when their clock lags, one past the high-water),
    so no writer gets near them, and ``insert_messages`` refuses the whole
    batch, writing nothing, if one is taken anyway.
    """
    ids: list[int] = []
    grain = (after >> _GRAIN_BITS) + 1
    while len(ids) < count:
        start = (grain << _GRAIN_BITS) | _HALF
        ids.extend(range(start, start + min(_HALF, count - len(ids))))
        grain += 1
    return ids


#: Most entries counted when reporting a group's backlog (each is read).
BACKLOG_CAP = 1_000


@dataclass
class Group:
    """What this process knows of one (stream, group)."""

    stream: str
    name: str
    queue: str  #: the group's copies
    at: str  #: its registration and position
    lock_id: int  #: the registration message's ID (the copy lock on Redis)
    position: int = 0  #: highest log ID known to be copied (a lower bound)
    copying: threading.Lock = field(default_factory=threading.Lock)

    @property
    def created_at(self) -> float:
        """Return when the group was registered, in seconds since the epoch."""
        # SimpleBroker IDs are nanosecond wall-clock times with a counter in
        # the low 12 bits: close enough to be a creation time.
        return self.lock_id / 1_000_000_000


class Groups:
    """The consumer groups of one broker's queues."""

    def __init__(self, store: Store, layout: Layout, copy_batch: int) -> None:
        self._store = store
        self._layout = layout
        self._batch = copy_batch
        self._known: dict[tuple[str, str], Group] = {}
        self._guard = threading.Lock()

    def forget(self) -> None:
        """Drop what this process knows (after the queues were deleted)."""
        with self._guard:
            self._known.clear()

    # -- registration ---------------------------------------------------------------
    def ensure(self, stream: str, group: str) -> Group:
        """Return the group, registering it on first use (idempotent, any process)."""
        key = (stream, group)
        known = self._known.get(key)
        if known is not None:
            return known
        at = self._layout.at(stream, group)
        lock_id = self._registration(at)
        if lock_id is None:
            self._store.conn.write(at, registration(stream, group))
            # Two processes may both register: the oldest registration is the
            # group's, so they agree on it whichever wrote first.
            lock_id = self._registration(at)
            if lock_id is None:  # pragma: no cover - deleted in between
                raise RuntimeError(f"registration of group {group!r} on {stream!r} vanished")
        found = Group(stream, group, self._layout.group(stream, group), at, lock_id)
        with self._guard:
            return self._known.setdefault(key, found)

    def _registration(self, at: str) -> int | None:
        for body, message_id in self._store.peek(at, _POSITION_SCAN):
            if is_registration(body):
                return message_id
        return None

    def registered(self, stream: str | None = None) -> Iterator[tuple[str, str]]:
        """Yield (stream, group) of every registered group (of ``stream``)."""
        prefix = self._layout.all_prefix if stream is None else self._layout.log(stream) + SEP
        for queue in self._store.conn.list_queues(prefix=prefix):
            parsed = self._layout.parse(queue)
            if parsed is not None and parsed.kind == "at" and parsed.group is not None:
                yield parsed.stream, parsed.group

    # -- position -----------------------------------------------------------------------
    def _position_record(self, group: Group) -> tuple[int, int]:
        """Return (log ID the group has copied up to, ID of that position record)."""
        for body, message_id in self._store.peek(group.at, _POSITION_SCAN, order="newest"):
            found = position_of(body)
            if found is not None:
                return found, message_id
        return 0, group.lock_id

    def position(self, group: Group) -> int:
        """Return the log ID of the newest entry copied into the group (0: none yet)."""
        return self._position_record(group)[0]

    def backlog(self, group: Group, cap: int = BACKLOG_CAP) -> int:
        """Return how many log entries the group has not copied yet (at most ``cap``)."""
        position = self.position(group)
        return len(self._store.peek(self._layout.log(group.stream), cap, after=position))

    # -- copying -----------------------------------------------------------------------
    def pull(self, group: Group) -> int:
        """Copy new log entries into the group; return how many this call copied.

        Returns 0 at once when the log has nothing newer than the group's
        known position, or when another consumer is copying (its copies
        wake this consumer's waiter).
        """
        conn = self._store.conn
        log = self._layout.log(group.stream)
        newest = conn.latest_pending_timestamp(log)
        if newest is None or newest <= group.position:
            return 0
        if not group.copying.acquire(blocking=False):
            return 0
        try:
            with self._store.lock(group.stream, group.name, group.lock_id) as locked:
                if not locked:
                    self._check_registration(group)
                    return 0
                return self._copy(group, log)
        finally:
            group.copying.release()

    def _copy(self, group: Group, log: str) -> int:
        """Copy one batch and the new position in one ``insert_messages`` (all or nothing)."""
        position, after = self._position_record(group)
        entries = self._store.peek(log, self._batch, after=position)
        if not entries:
            group.position = max(group.position, position)
            return 0
        for attempt in range(_INSERT_ATTEMPTS):
            ids = copy_ids(after, len(entries) + 1)
            records = [
                (group.queue, envelope(log_id, body), copy_id)
                for (body, log_id), copy_id in zip(entries, ids, strict=False)
            ]
            records.append((group.at, position_record(entries[-1][1]), ids[-1]))
            keys = [copy_key(group.queue, log_id) for _, log_id in entries] + [""]
            try:
                self._store.insert(records, keys)
                break
            except IntegrityError:
                # An ID of the batch is taken (see copy_ids): nothing was
                # written; take IDs past everything stored and try again.
                after = max(after, self._store.conn.refresh_last_timestamp())
                if attempt + 1 == _INSERT_ATTEMPTS:
                    raise
        group.position = max(group.position, entries[-1][1])
        self._store.notify(group.queue)
        self._prune(group, ids[-1])
        return len(entries)

    def _prune(self, group: Group, keep: int) -> None:
        """Delete older position records and extra registrations, now and then."""
        rows = self._store.peek(group.at, _PRUNE_AT)
        if len(rows) < _PRUNE_AT:
            return
        stale = [message_id for _, message_id in rows if message_id not in (group.lock_id, keep)]
        if stale:
            self._store.conn.delete_message_ids(group.at, stale)

    def _check_registration(self, group: Group) -> None:
        """Forget the group when its registration is gone (its queues were deleted)."""
        if self._registration(group.at) != group.lock_id:
            with self._guard:
                self._known.pop((group.stream, group.name), None)

    # -- retention --------------------------------------------------------------------------
    def trim(self, stream: str, maxlen: int) -> int:
        """Leave at most ``maxlen`` log entries, never one a group has not copied.

        With no group, the oldest entries beyond ``maxlen`` go (as Redis
        Streams' MAXLEN does); with groups, only entries every group has
        copied can go. Returns how many were removed.
        """
        if maxlen <= 0:
            return 0
        conn = self._store.conn
        log = self._layout.log(stream)
        groups = [self.ensure(stream, name) for _, name in self.registered(stream)]
        floor = min((self.position(group) for group in groups), default=None)
        count = sum(s.pending for s in conn.list_queue_stats(prefix=log) if s.queue == log)
        excess = count - maxlen
        if excess <= 0 or floor == 0:
            return 0
        before = None if floor is None else floor + 1
        ids = [message_id for _, message_id in self._store.peek(log, excess, before=before)]
        return int(conn.delete_message_ids(log, ids)) if ids else 0
