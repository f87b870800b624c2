"""Queue-level operations: listing, stats, existence, delete, rename, vacuum."""

from __future__ import annotations

import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from fnmatch import fnmatchcase
from typing import Any

from simplebroker.ext import SidecarSession, SidecarUnavailableError
from simplebroker.metadata import QueueRenameResult, QueueStats

from .. import calls
from .._sbcompat import (
    BODY_SEARCH_DEFAULT_LIMIT,
    BODY_SEARCH_REDIS_SCAN_CHUNK_SIZE,
    normalize_message_id,
    validate_body_contains,
    validate_body_search_limit,
    validate_timestamp_bound,
)
from ..activity import existing_listener
from ..validation import validate_queue_name
from ._base import CoreBase

_PREFIX_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")


def _validate_prefix(prefix: str) -> None:
    if prefix == "":
        return
    if len(prefix) > 512:
        raise ValueError("Invalid queue prefix: exceeds 512 characters")
    if prefix[0] in ".-" or not set(prefix) <= _PREFIX_CHARS:
        raise ValueError(
            "Invalid queue prefix: must contain only letters, numbers, periods, "
            "underscores, and hyphens. Cannot begin with a hyphen or a period"
        )


def _literal_prefix(pattern: str) -> str:
    cut = [i for i in (pattern.find("*"), pattern.find("?"), pattern.find("[")) if i != -1]
    return pattern[: min(cut)] if cut else pattern


def _lex_range(prefix: str | None, pattern: str | None) -> tuple[str, str] | None:
    """Return the registry lex range covering a prefix or a pattern's prefix."""
    if prefix is not None and pattern is not None:
        raise ValueError("prefix and pattern cannot be used together")
    literal = prefix if pattern is None else (_literal_prefix(pattern) or None)
    if literal is None:
        return None
    _validate_prefix(literal)
    if not literal:
        return None
    upper = literal[:-1] + chr(ord(literal[-1]) + 1)
    return f"[{literal}", f"({upper}"


def _keep(name: str, prefix: str | None, pattern: str | None) -> bool:
    if prefix is not None and not name.startswith(prefix):
        return False
    return pattern is None or fnmatchcase(name, pattern)


class QueuesMixin(CoreBase):
    """Operations on queues as a whole."""

    def list_queues(self, *, prefix: str | None = None, pattern: str | None = None) -> list[str]:
        """Return sorted names of queues holding any message (claimed included)."""
        names = self._queue_names(_lex_range(prefix, pattern))
        return [name for name in names if _keep(name, prefix, pattern)]

    def list_queue_stats(
        self, *, prefix: str | None = None, pattern: str | None = None
    ) -> list[QueueStats]:
        """Return stats of every listed queue (one round trip)."""
        stats = self._run(calls.stats(lex_range=_lex_range(prefix, pattern)))
        return [item for item in stats if _keep(item.queue, prefix, pattern)]

    def get_queue_stats(self) -> list[tuple[str, int, int]]:
        """Return (queue, pending, total) for every queue, sorted by name."""
        return [(item.queue, item.pending, item.total) for item in self._run(calls.stats())]

    def get_queue_stat(self, queue: str) -> QueueStats:
        """Return pending, claimed and total counts of one queue."""
        validate_queue_name(queue)
        return self._run(calls.stats(queue))[0]

    def get_overall_stats(self) -> tuple[int, int]:
        """Return (claimed, total) over every queue."""
        counts = self._counts()
        return counts["claimed"], sum(counts.values())

    def count_claimed_messages(self) -> int:
        """Return how many claimed messages await vacuum."""
        return self._counts()["claimed"]

    def _counts(self) -> dict[str, int]:
        keys = self._runner.keys
        names = ("claimed", "pending", "reserved", "delayed")

        def fetch(client: Any) -> list[int]:
            pipe = client.pipeline(transaction=False)
            for name in names:
                pipe.zcard(getattr(keys, name))
            return [int(value) for value in pipe.execute()]

        return dict(zip(names, self._runner.execute(fetch, idempotent=True), strict=True))

    def status(self) -> dict[str, int]:
        """Return total messages and the durable high-water mark."""
        keys = self._runner.keys

        def fetch(client: Any) -> list[Any]:
            pipe = client.pipeline(transaction=False)
            for key in (keys.claimed, keys.pending, keys.reserved, keys.delayed):
                pipe.zcard(key)
            pipe.hget(keys.meta, "last_ts")
            return list(pipe.execute())

        values = self._runner.execute(fetch, idempotent=True)
        return {
            "total_messages": sum(int(value) for value in values[:4]),
            "last_timestamp": int(values[4] or 0),
            # SimpleBroker defines db_size as the database file's size on
            # disk; a Redis namespace has no file of its own.
            "db_size": 0,
        }

    def queue_exists(self, queue: str) -> bool:
        """Return whether ``queue`` holds any message, claimed included."""
        validate_queue_name(queue)
        return self._run(calls.probe_exists(queue))

    queue_exists_and_has_messages = queue_exists

    def has_pending_messages(self, queue: str, after_timestamp: int | None = None) -> bool:
        """Return whether ``queue`` has pending messages (above a bound)."""
        validate_queue_name(queue)
        after = validate_timestamp_bound("after_timestamp", after_timestamp)
        # A queue found empty stays empty until its wake-up channel hears
        # something (every script that makes a message pending, delayed or
        # released publishes there). While this process is subscribed to the
        # channel (a watcher), an idle check is one PING on the subscription,
        # answered after every wake-up published before it: no script runs.
        listener = existing_listener(self._runner)
        channel = self._runner.keys.wake_channel(queue)
        mark = None if listener is None else listener.quiet_mark(channel)
        if (
            mark is not None
            and listener is not None
            and listener.quiet_since(channel, after) == mark
            and listener.sync()
            and listener.quiet_mark(channel) == mark
        ):
            return False
        pending = self._run(calls.probe_pending(queue, after))
        if mark is not None and listener is not None:
            listener.remember(channel, after, None if pending else mark)
        return pending

    def latest_pending_timestamp(self, queue: str) -> int | None:
        """Return the newest pending message ID of ``queue``, or None."""
        validate_queue_name(queue)
        return self._run(calls.probe_latest(queue))

    def get_data_version(self) -> int | None:
        """Return None: Redis has no SQLite data_version (waiters use Pub/Sub)."""
        return None

    def get_meta(self) -> dict[str, int | str]:
        """Return the namespace meta record."""
        key = self._runner.keys.meta
        raw = self._runner.execute(lambda client: client.hgetall(key), idempotent=True)
        return {
            str(name): int(value) if name != "magic" and str(value).isdigit() else str(value)
            for name, value in raw.items()
        }

    def sidecar(self, *, transaction: bool = False) -> AbstractContextManager[SidecarSession]:
        """Raise: sidecar tables need SQL storage, which Redis does not have."""
        raise SidecarUnavailableError(
            "the redis backend keeps queues in Redis data structures, not SQL tables; "
            "sidecar sessions need the sqlite or postgres backend"
        )

    # -- delete ----------------------------------------------------------------
    def delete(self, queue: str | None = None) -> int:
        """Delete every message of ``queue`` (or of every queue); return the count.

        Each queue is deleted by one script. Deleting all queues snapshots the
        registry first; a reservation met on the way stops the deletion with
        an error, leaving earlier queues deleted and later ones intact.
        """
        if queue is not None:
            validate_queue_name(queue)
        self._guard("delete")
        names = [queue] if queue is not None else self._queue_names()
        return sum(self._run(calls.delete_queues([name])) for name in names)

    def delete_message_ids(self, queue: str, message_ids: Sequence[int | str]) -> int:
        """Delete exact message IDs (pending or claimed) of one queue."""
        validate_queue_name(queue)
        self._guard("delete_message_ids")
        if not message_ids:
            return 0
        ids = dict.fromkeys(normalize_message_id(value) for value in message_ids)
        return self._run(calls.delete_ids(queue, ids))

    def delete_from_queues(
        self, queue_names: Sequence[str], *, before_timestamp: int | None = None
    ) -> int:
        """Delete messages of several queues (optionally only IDs below a bound)."""
        self._guard("delete_from_queues")
        if isinstance(queue_names, (str, bytes)):
            raise TypeError("queue_names must be a sequence of queue names, not a string")
        before = validate_timestamp_bound("before_timestamp", before_timestamp)
        names = tuple(dict.fromkeys(queue_names))
        for queue in names:
            validate_queue_name(queue)
        if not names:
            return 0
        return self._run(calls.delete_queues(names, before))

    def find_message_ids(
        self,
        queue: str,
        *,
        body_contains: str,
        limit: int = BODY_SEARCH_DEFAULT_LIMIT,
        after_timestamp: int | None = None,
        before_timestamp: int | None = None,
        include_claimed: bool = False,
    ) -> list[int]:
        """Return IDs of messages whose body contains a literal substring.

        Scans in ID order, 500 messages per script call, so a large queue
        never blocks the server for long.
        """
        validate_queue_name(queue)
        needle = validate_body_contains(body_contains)
        limit = validate_body_search_limit(limit)
        after = validate_timestamp_bound("after_timestamp", after_timestamp)
        before = validate_timestamp_bound("before_timestamp", before_timestamp)
        found: list[int] = []
        cursor = after
        while len(found) < limit:
            cursor, ids = self._run(
                calls.find(
                    queue,
                    needle,
                    wanted=limit - len(found),
                    after=cursor,
                    before=before,
                    include_claimed=include_claimed,
                    chunk=BODY_SEARCH_REDIS_SCAN_CHUNK_SIZE,
                )
            )
            found.extend(ids)
            if cursor is None:
                break
        return found[:limit]

    # -- rename and vacuum -------------------------------------------------------
    def rename_queue(
        self, old_queue: str, new_queue: str, *, retarget_aliases: bool = True
    ) -> QueueRenameResult:
        """Rename a queue atomically (IDs kept), retargeting its aliases."""
        validate_queue_name(old_queue)
        validate_queue_name(new_queue)
        if old_queue == new_queue:
            raise ValueError("Source and target queues cannot be the same")
        self._guard("rename_queue")
        renamed, retargeted = self._run(
            calls.rename(
                old_queue, new_queue, retarget_aliases=retarget_aliases, version=time.time_ns()
            )
        )
        return QueueRenameResult(
            old_queue=old_queue,
            new_queue=new_queue,
            messages_renamed=renamed,
            aliases_retargeted=retargeted,
        )

    def vacuum(self, *, compact: bool = False) -> None:
        """Remove claimed messages (in bounded batches); ``compact`` is a no-op."""
        self._guard("vacuum")
        self._vacuum_claimed()

    def recover_stale(self, queue: str | None = None) -> int:
        """Release at-least-once batches older than ``stale_batch_seconds``.

        Returns the number of live message IDs made pending again. Reads of a
        queue and the periodic maintenance pass also run this.
        """
        if queue is not None:
            validate_queue_name(queue)
        released = 0
        while True:
            recovery = self._run(calls.recover(queue, max_tokens=256))
            released += recovery.released
            if not recovery.more or not recovery.tokens:
                return released
