"""``ResultConsumer``: waiting for results, woken through Pub/Sub instead of polling.

Celery's Redis backend keeps its result waiting in a ``ResultConsumer`` of
its own too. Storing a task's result publishes a wake-up on the result's
channel in the same script (:func:`.entries.wake_name`); a waiter subscribes
before its first read, then sleeps until woken, re-reading every
:data:`SAFETY_RECHECK` seconds in case a wake-up was lost (they are hints).
``interval`` only paces ``on_interval`` callbacks, which run after every
read, also the one that finds the result ready: that is where Celery checks
a result's parents (``AsyncResult.get()`` raises a failed parent's error,
as with Celery's Redis backend).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Final

from celery import states
from celery.exceptions import TimeoutError
from kombu.utils.encoding import bytes_to_str

from simplebroker_redis import RedisRunner
from simplebroker_redis.activity import QueueActivityWaiter, open_waiter

from .entries import wake_name

logger = logging.getLogger("celery_simplebroker")

#: Seconds between re-reads of a result while no wake-up arrives (wake-ups are hints).
SAFETY_RECHECK: Final[float] = 5.0


class ResultConsumer:
    """Waits for the results a backend stores; the backend's ``wait_for`` and ``get_many``."""

    def __init__(self, backend: Any, runner: RedisRunner) -> None:
        self.backend = backend  # Celery's KeyValueStoreBackend: meta reads and the cache
        self.runner = runner

    def _waiter(self, task_ids: Iterable[str]) -> QueueActivityWaiter | None:
        names = sorted({wake_name(bytes_to_str(task_id)) for task_id in task_ids})
        try:
            return open_waiter(self.runner, names, None)
        except Exception as exc:  # noqa: BLE001 - without wake-ups we re-read on a timer
            logger.debug("no result wake-ups: %s", exc)
            return None

    @staticmethod
    def _nap(waiter: QueueActivityWaiter | None, seconds: float) -> None:
        if seconds <= 0:
            return
        if waiter is None:
            time.sleep(min(seconds, 0.5))
        else:
            waiter.wait(seconds)

    @staticmethod
    def _close(waiter: QueueActivityWaiter | None) -> None:
        if waiter is not None:
            try:
                waiter.close()
            except Exception as exc:  # noqa: BLE001 - the listener recovers on its own
                logger.debug("closing a result waiter failed: %s", exc)

    @staticmethod
    def _pause(
        interval: float, on_interval: Callable[[], Any] | None, deadline: float | None, text: str
    ) -> float:
        """Return how long to sleep before the next read; raise TimeoutError past ``deadline``."""
        nap = interval if on_interval else SAFETY_RECHECK
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(text)
            nap = min(nap, remaining)
        return nap

    def wait_for(
        self,
        task_id: str,
        timeout: float | None = None,
        interval: float = 0.5,
        on_interval: Callable[[], Any] | None = None,
    ) -> Any:
        """Return the task's meta once ready, woken by its result's Pub/Sub message."""
        deadline = None if timeout is None else time.monotonic() + timeout
        waiter = self._waiter([task_id])  # subscribed before the first read
        try:
            while True:
                meta = self.backend.get_task_meta(task_id)
                if on_interval:
                    on_interval()
                if meta["status"] in states.READY_STATES:
                    return meta
                text = "The operation timed out."
                self._nap(waiter, self._pause(interval, on_interval, deadline, text))
        finally:
            self._close(waiter)

    def get_many(
        self,
        task_ids: Iterable[str],
        timeout: float | None = None,
        interval: float = 0.5,
        on_message: Callable[[Any], Any] | None = None,
        on_interval: Callable[[], Any] | None = None,
        max_iterations: int | None = None,
        ready_states: frozenset[str] = states.READY_STATES,
    ) -> Iterator[tuple[str, Any]]:
        """Yield (task id, meta) as results become ready, woken through Pub/Sub."""
        backend = self.backend
        ids = {bytes_to_str(task_id) for task_id in task_ids}
        for task_id in list(ids):
            cached = backend._cache.get(task_id)
            if cached is not None and cached["status"] in ready_states:
                ids.discard(task_id)
                yield task_id, cached
        if not ids:
            return
        deadline = None if timeout is None else time.monotonic() + timeout
        waiter = self._waiter(ids)
        iterations = 0
        try:
            while ids:
                keys = list(ids)
                values = backend.mget([backend.get_key_for_task(key) for key in keys])
                ready = backend._mget_to_results(values, keys, ready_states)
                backend._cache.update(ready)
                ids.difference_update(ready)
                for task_id, meta in ready.items():
                    if on_message is not None:
                        on_message(meta)
                    yield bytes_to_str(task_id), meta
                if not ids:
                    return
                if on_interval:
                    on_interval()
                text = f"Operation timed out ({timeout})"
                self._nap(waiter, self._pause(interval, on_interval, deadline, text))
                iterations += 1
                if max_iterations and iterations >= max_iterations:
                    return
        finally:
            self._close(waiter)
