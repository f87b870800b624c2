"""SimpleBroker's ``ActivityWaiter`` on the process's wake-up listener."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any, Final

from ..keys import Keyspace
from ..runner import RedisRunner
from ..validation import validate_queue_name
from .registry import listener_for

#: Longest slice a waiter sleeps before re-checking its stop event.
STOP_POLL: Final[float] = 0.05


def wake_channels(keys: Keyspace, queue_names: Iterable[str]) -> tuple[str, ...]:
    """Validate queue names; return their wake channels, each once, in order.

    Shared by the sync waiter and :class:`~simplebroker_redis.activity.AsyncActivity`.
    """
    names = list(queue_names)
    if not names:
        raise ValueError("queue_names cannot be empty")
    for name in names:
        validate_queue_name(name)
    return tuple(keys.wake_channel(name) for name in dict.fromkeys(names))


class QueueActivityWaiter:
    """SimpleBroker ``ActivityWaiter`` for one or more queues.

    ``wait(timeout)`` returns True when a wake-up arrived (since the last
    call), False on timeout or when the stop event is set. ``close()`` is
    terminal and idempotent; the waiter owns only its registrations.
    """

    def __init__(self, runner: RedisRunner, queue_names: Sequence[str], stop_event: Any) -> None:
        self._runner = runner
        self._channels = wake_channels(runner.keys, queue_names)
        self._stop_event = stop_event
        self._event = threading.Event()
        self._closed = False
        self._pid = os.getpid()
        self._listener = listener_for(runner)
        self._listener.register(self._channels, self._event.set)

    def wait(self, timeout: float) -> bool:
        """Block until a wake-up, the stop event, or ``timeout`` seconds."""
        if self._pid != os.getpid():
            self._rebind_after_fork()
        deadline = time.monotonic() + max(0.0, float(timeout))
        while True:
            if self._stop_event is not None and self._stop_event.is_set():
                return False
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return self._consume()
            slice_ = remaining if self._stop_event is None else min(remaining, STOP_POLL)
            if self._event.wait(slice_):
                return self._consume()

    def _consume(self) -> bool:
        woken = self._event.is_set()
        self._event.clear()
        return woken

    def _rebind_after_fork(self) -> None:
        self._pid = os.getpid()
        self._event = threading.Event()
        self._listener = listener_for(self._runner)
        self._listener.register(self._channels, self._event.set)

    def close(self) -> None:
        """Terminal, idempotent close; raises the first cleanup failure (with notes)."""
        if self._closed:
            return
        self._closed = True
        failures: list[Exception] = []
        for channel in self._channels:
            try:
                self._listener.unregister(channel, self._event.set)
            except Exception as exc:  # noqa: BLE001 - every cleanup is attempted
                failures.append(exc)
        if failures:
            first = failures[0]
            for later in failures[1:]:
                first.add_note(f"later cleanup failure: {type(later).__name__}: {later}")
            raise first


def open_waiter(
    runner: RedisRunner, queue_names: Sequence[str], stop_event: Any
) -> QueueActivityWaiter:
    """Validate queue names and return a registered waiter."""
    return QueueActivityWaiter(runner, queue_names, stop_event)
