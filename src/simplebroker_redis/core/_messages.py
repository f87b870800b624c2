"""Writes: ID allocation, write, exact-ID insert and broadcast."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from fnmatch import fnmatchcase
from typing import Literal, TypeVar

from simplebroker.ext import validate_keep_newest

from .. import calls
from .._sbcompat import normalize_insert_records
from ..calls import Call
from ..errors import ScriptConflict
from ..retry import ConflictBackoff
from ..validation import check_task_key, validate_queue_name
from ._base import CoreBase

R = TypeVar("R")
BroadcastMode = Literal["all", "existing", "create"]


class MessagesMixin(CoreBase):
    """Message identity and every operation that creates messages."""

    # -- identity --------------------------------------------------------------
    def generate_timestamp(self) -> int:
        """Allocate and durably record a new message ID without a message."""
        self._guard("generate_timestamp")
        stamped = self._allocate(1, lambda candidates: calls.stamp(candidates[0]))
        self._clock.observe(stamped)
        return stamped

    get_ts = generate_timestamp

    def get_cached_last_timestamp(self) -> int:
        """Return the last ID this connection knows of (no I/O after the first)."""
        return self._clock.get_cached_last_ts()

    def refresh_last_timestamp(self) -> int:
        """Read the durable high-water mark and cache it."""
        return self._clock.refresh_last_ts()

    def advance_last_timestamp(self, timestamp: int) -> int:
        """Monotonically raise the durable high-water to ``timestamp``, then read it."""
        self._guard("advance_last_timestamp")
        return self._clock.advance_to_at_least(timestamp)

    def _allocate(self, count: int, build: Callable[[list[int]], Call[R]]) -> R:
        """Run ``build(candidates)`` until the script accepts the IDs.

        A CLOCK conflict (logical counter exhausted at the durable high-water)
        refreshes the cached high-water and retries at once; the generator
        then waits for the clock, as SimpleBroker's does. An ID collision
        backs off (see :class:`~simplebroker_redis.retry.ConflictBackoff`),
        observing the stop event. Both are reported by the script before it
        writes anything; transport errors propagate untouched because the
        server may already have committed.
        """
        backoff = ConflictBackoff(self._runner.where)
        while True:
            try:
                return self._run(build(self._clock.candidates(count)))
            except ScriptConflict as conflict:
                self._ts_conflict_count += 1
                self._clock.observe(backoff.observed(conflict))
                delay = backoff.after(conflict)
                if delay and self._stop_event.wait(delay):
                    raise backoff.stopped(conflict) from conflict

    def run_allocating(
        self,
        count: int,
        build: Callable[[list[int]], Call[R]],
        committed: Callable[[R], Sequence[int]],
    ) -> R:
        """Run an integration's own script that writes ``count`` new messages.

        ``build(candidates)`` returns the call; the candidates come from this
        core's clock and ID conflicts are retried exactly as for :meth:`write`.
        ``committed(reply)`` returns the IDs the script wrote (possibly none),
        which the clock and automatic maintenance then account for.
        """
        self._guard("write")
        reply = self._allocate(count, build)
        ids = committed(reply)
        if ids:
            self._clock.observe(max(ids))
            self._record_activity(len(ids))
        return reply

    def get_conflict_metrics(self) -> dict[str, int]:
        """Return how often ID allocation met a conflict, and high-water repairs."""
        return {
            "ts_conflict_count": self._ts_conflict_count,
            "ts_resync_count": self._ts_resync_count,
        }

    def reset_conflict_metrics(self) -> None:
        """Reset the conflict counters."""
        self._ts_conflict_count = 0
        self._ts_resync_count = 0

    def _resync_timestamp_generator(self) -> None:
        """Raise a high-water mark that fell below a stored ID (never lowers it)."""
        old, new = self._run(calls.resync())
        if new > old:
            self._ts_resync_count += 1
            self._clock.observe(new)

    # -- writes ----------------------------------------------------------------
    def write(
        self,
        queue: str,
        message: str,
        *,
        keep_newest: int | None = None,
        task_key: str = "",
        dedupe_key: str | None = None,
        dedupe_seconds: float = calls.DEFAULT_DEDUPE_SECONDS,
    ) -> int:
        """Write one message; return its ID (one round trip).

        With ``keep_newest=N`` the same script leaves only the N newest
        messages of the queue pending; older pending ones become claimed.

        ``task_key`` indexes the message under a framework's task id
        (:func:`simplebroker_redis.tasks.index_key`), in the same step.

        ``dedupe_key`` makes the write idempotent: if a write with the same
        key stored its message within the last ``dedupe_seconds``, nothing
        is stored and that write's ID is returned. A write that failed with
        ``OutcomeUnknown`` can so be sent again without a second copy.
        """
        keep = validate_keep_newest(keep_newest)
        validate_queue_name(queue)
        check_task_key(task_key)
        once = (
            None
            if dedupe_key is None
            else calls.dedupe(self._runner.keys, dedupe_key, dedupe_seconds)
        )
        self._guard("write")
        self._validate_message(message)
        committed = self._allocate(
            1,
            lambda candidates: calls.write(
                queue,
                message,
                candidates[0],
                keep_newest=keep or 0,
                maintenance=self._maintenance_spec(),
                task_key=task_key,
                once=once,
            ),
        )
        self._clock.observe(committed)
        self._record_activity(1)
        return committed

    def write_delayed(
        self, queue: str, message: str, delay_seconds: float, *, task_key: str = ""
    ) -> int:
        """Write a message that becomes claimable only after ``delay_seconds``.

        Until then it is pending for peek and stats but not claimable. The
        delay is measured on the server's clock. ``task_key`` indexes it, as
        for :meth:`write`.
        """
        validate_queue_name(queue)
        check_task_key(task_key)
        self._guard("write")
        self._validate_message(message)
        delay_us = max(0, round(float(delay_seconds) * 1_000_000))
        committed = self._allocate(
            1,
            lambda candidates: calls.write(
                queue,
                message,
                candidates[0],
                delay_us=delay_us,
                maintenance=self._maintenance_spec(),
                task_key=task_key,
            ),
        )
        self._clock.observe(committed)
        self._record_activity(1)
        return committed

    def insert_messages(
        self, records: Iterable[tuple[str, str, int | str]], *, task_keys: Sequence[str] = ()
    ) -> None:
        """Insert pending messages with exact IDs, all or nothing.

        ``task_keys``, when given, names the task index key of each record
        ('' for none), in order (:func:`simplebroker_redis.tasks.index_key`).
        """
        self._guard("insert_messages")
        keys = [check_task_key(key) for key in task_keys]
        normalized, required = normalize_insert_records(
            records,
            validate_queue_name=lambda queue: None if validate_queue_name(queue) else None,
            validate_message_size=lambda body: None if self._validate_message(body) else None,
        )
        if not normalized or required is None:
            return
        if keys and len(keys) != len(normalized):
            raise ValueError("give one task key per record, or none")
        if keys:
            keyed = [(*record, key) for record, key in zip(normalized, keys, strict=True)]
            self._run(calls.insert(required, keyed))
        else:
            self._run(calls.insert(required, normalized))
        self._clock.observe(required)
        self._record_activity(len(normalized))

    # -- broadcast ---------------------------------------------------------------
    def broadcast(
        self,
        message: str,
        *,
        pattern: str | None = None,
        queue_names: Sequence[str] | None = None,
        create_missing: bool = False,
    ) -> int:
        """Insert one copy of ``message`` into each selected queue, atomically.

        Patternless and exact-name selection happen inside the script (one
        round trip, constant in the number of queues). A pattern is matched
        with ``fnmatchcase`` against a registry snapshot taken just before.
        """
        self._guard("broadcast")
        self._validate_message(message)
        names = self._broadcast_names(pattern, queue_names, create_missing)
        if names == ():
            return 0
        mode: BroadcastMode
        if names is not None:
            mode = "create" if create_missing else "existing"
        elif pattern:
            names = tuple(q for q in self._queue_names() if fnmatchcase(q, pattern))
            if not names:
                return 0
            mode = "create"
        else:
            mode = "all"
        result = self._allocate(
            len(names) if names else 1,
            lambda candidates: calls.broadcast(message, mode, candidates, names or ()),
        )
        if result.count:
            self._clock.observe(result.last)
            self._record_activity(result.count)
        return result.count

    @staticmethod
    def _broadcast_names(
        pattern: str | None,
        queue_names: Sequence[str] | None,
        create_missing: bool,
    ) -> tuple[str, ...] | None:
        if pattern is not None and queue_names is not None:
            raise ValueError("pattern and queue_names cannot be used together")
        if not isinstance(create_missing, bool):
            raise TypeError("create_missing must be a boolean")
        if create_missing and queue_names is None:
            raise ValueError("create_missing requires queue_names")
        if queue_names is None:
            return None
        if isinstance(queue_names, (str, bytes)):
            raise TypeError("queue_names must be a sequence of queue names, not a string")
        names = tuple(dict.fromkeys(queue_names))
        for queue in names:
            validate_queue_name(queue)
        return names
