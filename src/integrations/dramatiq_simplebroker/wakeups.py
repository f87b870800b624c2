"""A consumer's sleep: until a wake-up of its queues, an acknowledgement, or a deadline.

Every script that makes a message pending publishes on its queue's wake
channel (sharded Pub/Sub, read by the process's one listener thread,
:func:`simplebroker_redis.activity.listener_for`), so a consumer that found
its queues empty sleeps here instead of polling. It wakes for:

- a wake-up on any of its channels (a write, a release, a recovery, a due
  delayed message promoted by someone's upkeep);
- a nudge: an acknowledgement made room in its prefetch window;
- its deadline: Dramatiq's ``worker_timeout`` (the consumer returns None
  and the worker checks whether it should stop).

A wake-up that arrives while the consumer is busy is kept (``pending``)
for its next look, so none is lost between a reservation and a sleep.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Sequence

from simplebroker_redis import RedisRunner
from simplebroker_redis.activity import listener_for

logger = logging.getLogger("dramatiq_simplebroker")


class Wakeups:
    """Wake-up subscriptions of one consumer's storage queues, and its sleep."""

    def __init__(self, runner: RedisRunner, queues: Sequence[str]) -> None:
        self._runner = runner
        self._channels = [runner.keys.wake_channel(queue) for queue in queues]
        self._registered: list[str] = []
        self._cond = threading.Condition()
        self._woken = True  # nothing known yet: the first look asks the server
        self._nudged = False
        self._pid = os.getpid()
        self._subscribed = False

    def subscribe(self) -> None:
        """Subscribe (once); returns when the server confirmed, so no later write is missed."""
        if self._subscribed and self._pid == os.getpid():
            return
        self._pid = os.getpid()
        listener_for(self._runner).register(self._channels, self._wake)
        self._registered = list(self._channels)
        self._subscribed = True

    def watch(self, queues: Sequence[str]) -> None:
        """Also wake for ``queues`` (a priority level appeared); confirmed before it returns."""
        channels = [self._runner.keys.wake_channel(queue) for queue in queues]
        fresh = [channel for channel in channels if channel not in self._channels]
        if not fresh:
            return
        self._channels += fresh
        if self._subscribed and self._pid == os.getpid():
            listener_for(self._runner).register(fresh, self._wake)
            self._registered += fresh
        self._wake()

    def close(self) -> None:
        """Drop the subscriptions (best effort: the listener outlives failures)."""
        if not self._subscribed or self._pid != os.getpid():
            return
        self._subscribed = False
        listener = listener_for(self._runner)
        for channel in self._registered:
            try:
                listener.unregister(channel, self._wake)
            except Exception as exc:  # noqa: BLE001 - the listener resubscribes on its own
                logger.debug("unsubscribing %s failed: %s", channel, exc)

    def _wake(self) -> None:  # the listener thread
        with self._cond:
            self._woken = True
            self._cond.notify_all()

    def nudge(self) -> None:
        """End a sleep: the prefetch window has room again (any thread)."""
        with self._cond:
            self._nudged = True
            self._cond.notify_all()

    def take(self) -> bool:
        """Return (and clear) whether a wake-up came since the last look."""
        with self._cond:
            woken, self._woken = self._woken, False
            return woken

    def wake(self) -> None:
        """Mark the queues worth a look (after a reservation that filled its batch)."""
        self._wake()

    def wait(self, seconds: float, *, wakeups: bool) -> bool:
        """Sleep until nudged, woken (when ``wakeups``), or ``seconds``; True unless timed out.

        With ``wakeups`` False (the prefetch window is full) a wake-up does
        not end the sleep but is kept for the next look.
        """
        with self._cond:

            def ready() -> bool:
                return self._nudged or (wakeups and self._woken)

            happened = self._cond.wait_for(ready, max(0.0, seconds))
            self._nudged = False
            return happened


def close_quietly(wakeups: Wakeups) -> None:
    """Close ``wakeups``, whatever the server says."""
    with contextlib.suppress(Exception):
        wakeups.close()
