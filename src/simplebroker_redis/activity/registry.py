"""The wake-up listeners of this process: one per (process, target, namespace).

Keyed by process id as well, so a forked child never uses its parent's
listener (whose thread did not survive the fork): it gets its own the first
time it asks.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from ..runner import RedisRunner
from .listener import WakeupListener

_LISTENERS: dict[tuple[Any, ...], WakeupListener] = {}
_LISTENERS_LOCK = threading.Lock()


def existing_listener(runner: RedisRunner) -> WakeupListener | None:
    """Return this process's listener for the runner's namespace, if one exists."""
    return _LISTENERS.get((os.getpid(), *runner.identity))


def listener_for(runner: RedisRunner) -> WakeupListener:
    """Return this process's listener for the runner's target and namespace."""
    key = (os.getpid(), *runner.identity)
    with _LISTENERS_LOCK:
        listener = _LISTENERS.get(key)
        if listener is None:
            listener = _LISTENERS[key] = WakeupListener(runner)
        return listener


def close_idle_listeners(timeout: float = 5.0) -> int:
    """Close this process's wake-up connections that no waiter uses, at once.

    An idle listener closes its connection by itself after
    :data:`~.listener.IDLE_LINGER` seconds; call this before stopping a
    server the process is done with (a demo, a test), so the listener does
    not see its connection drop and log a reconnect warning. Waits up to
    ``timeout`` seconds in total for the listener threads; returns how many
    closed.
    """
    pid = os.getpid()
    with _LISTENERS_LOCK:
        listeners = [listener for key, listener in _LISTENERS.items() if key[0] == pid]
    threads = [thread for listener in listeners if (thread := listener.retire_if_idle())]
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return sum(not thread.is_alive() for thread in threads)
