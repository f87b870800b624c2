"""Writes: ID allocation, write, exact-ID insert and broadcast."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from fnmatch import fnmatchcase
from typing import Any, Final

from simplebroker.ext import validate_keep_newest

from .._sbcompat import normalize_insert_records
from ..errors import ScriptConflict
from ..keys import format_id
from ..validation import validate_queue_name
from ._base import CoreBase

#: Total time an ID allocation may keep meeting conflicts before failing.
CONFLICT_BUDGET_SECONDS: Final[float] = 30.0

#: Longest single backoff sleep between conflicting attempts.
CONFLICT_MAX_SLEEP: Final[float] = 0.25


class MessagesMixin(CoreBase):
    """Message identity and every operation that creates messages."""

    # -- identity --------------------------------------------------------------
    def generate_timestamp(self) -> int:
        """Allocate and durably record a new message ID without a message."""
        self._guard("generate_timestamp")
        stamped = int(self._allocate(1, lambda candidates: self._call("stamp", candidates[0])))
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

    def _allocate(self, count: int, attempt: Callable[[list[str]], Any]) -> Any:
        """Run ``attempt(candidates)`` until the script accepts the IDs.

        A CLOCK conflict (logical counter exhausted at the durable high-water)
        refreshes the cached high-water and retries at once; the generator
        then waits for the clock, as SimpleBroker's does. An ID collision
        backs off exponentially (capped at 250 ms) for up to 30 s. Both are
        reported by the script before it writes anything; transport errors
        propagate untouched because the server may already have committed.
        """
        deadline = time.monotonic() + CONFLICT_BUDGET_SECONDS
        sleep = 0.001
        conflicts = 0
        while True:
            candidates = [format_id(value) for value in self._clock.candidates(count)]
            try:
                return attempt(candidates)
            except ScriptConflict as conflict:
                conflicts += 1
                self._ts_conflict_count += 1
                self._clock.observe(int(conflict.detail.split()[0]))
                if conflict.code == "CLOCK" and time.monotonic() < deadline:
                    continue
                if time.monotonic() >= deadline or self._stop_event.wait(sleep):
                    raise RuntimeError(
                        f"Failed to allocate a message ID after {conflicts} "
                        f"conflicting attempts in {self._runner.where}; the "
                        "durable high-water mark or stored IDs keep colliding"
                    ) from conflict
                sleep = min(sleep * 2, CONFLICT_MAX_SLEEP)

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
        old, new = self._call("resync")
        if int(new) > int(old):
            self._ts_resync_count += 1
            self._clock.observe(int(new))

    # -- writes ----------------------------------------------------------------
    def write(self, queue: str, message: str, *, keep_newest: int | None = None) -> int:
        """Write one message; return its ID (one round trip).

        With ``keep_newest=N`` the same script leaves only the N newest
        messages of the queue pending; older pending ones become claimed.
        """
        keep = validate_keep_newest(keep_newest)
        validate_queue_name(queue)
        self._guard("write")
        self._validate_message(message)
        committed = int(
            self._allocate(
                1,
                lambda candidates: self._call(
                    "write", queue, message, candidates[0], keep or 0, 0, self._maintenance_spec()
                ),
            )
        )
        self._clock.observe(committed)
        self._record_activity(1)
        return committed

    def write_delayed(self, queue: str, message: str, delay_seconds: float) -> int:
        """Write a message that becomes claimable only after ``delay_seconds``.

        Until then it is pending for peek and stats but not claimable. The
        delay is measured on the server's clock.
        """
        validate_queue_name(queue)
        self._guard("write")
        self._validate_message(message)
        delay_us = max(0, round(float(delay_seconds) * 1_000_000))
        committed = int(
            self._allocate(
                1,
                lambda candidates: self._call(
                    "write", queue, message, candidates[0], 0, delay_us, self._maintenance_spec()
                ),
            )
        )
        self._clock.observe(committed)
        self._record_activity(1)
        return committed

    def insert_messages(self, records: Iterable[tuple[str, str, int | str]]) -> None:
        """Insert pending messages with exact IDs, all or nothing."""
        self._guard("insert_messages")
        normalized, required = normalize_insert_records(
            records,
            validate_queue_name=lambda queue: None if validate_queue_name(queue) else None,
            validate_message_size=lambda body: None if self._validate_message(body) else None,
        )
        if not normalized or required is None:
            return
        args: list[object] = [format_id(required)]
        for queue, message, message_id in normalized:
            args.extend((queue, format_id(message_id), message))
        self._call("insert", *args)
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
        if names is not None:
            mode = "create" if create_missing else "existing"
        elif pattern:
            names = tuple(q for q in self._registry_snapshot() if fnmatchcase(q, pattern))
            if not names:
                return 0
            mode = "create"
        else:
            mode = "all"
        result = self._allocate(
            len(names) if names else 1,
            lambda candidates: self._call(
                "broadcast", message, mode, len(candidates), *candidates, *(names or ())
            ),
        )
        count = int(result[0])
        if count:
            self._clock.observe(int(result[2]))
            self._record_activity(count)
        return count

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

    def _registry_snapshot(self) -> list[str]:
        keys = self._runner.keys
        return self._runner.execute(
            lambda client: [str(name) for name in client.zrange(keys.queues, 0, -1)],
            idempotent=True,
        )
