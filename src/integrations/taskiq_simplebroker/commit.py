"""Group commit: result writes and acknowledgements in one round trip.

A worker finishing a task must store its result and acknowledge the
message. The :class:`Committer` sends both in one ``commit`` script (results
first, then the settlements, validated before anything is written), and
batches: requests arriving while a round trip is in flight share the next
one, and while other tasks of the worker are still running it waits up to
:data:`COALESCE_SECONDS` for their acknowledgements too. A task finishing
alone is sent at once. Under load a worker therefore spends well under one
round trip, and one command, per task on results and acknowledgements.

A batch is safe to send again: ``SET`` is idempotent, and a settlement only
touches IDs the token still holds (a repeat reports them lost). Transient
failures (server restarting, socket timeouts) are retried with exponential
backoff; the heartbeat keeps the leases alive meanwhile. A try that
happened but that too few replicas confirmed (``ReplicationTimeout``) is
repeated too, until a replica confirms it; its own reply, not the
repeat's, says which acknowledgements came too late.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from simplebroker_redis import ReplicationTimeout, calls
from simplebroker_redis.aio import AsyncRedisRunner
from simplebroker_redis.types import SettleGroup, Settlement, ValueWrite

from .errors import BACKOFF_MAX, BACKOFF_MIN, is_transient

logger = logging.getLogger("taskiq_simplebroker")

#: Seconds a batch is retried before it is given up (and logged).
RETRY_SECONDS: Final[float] = 120.0

#: While other tasks are in flight, wait this long for their acknowledgements
#: to share the round trip (a task finishing alone is sent at once).
COALESCE_SECONDS: Final[float] = 0.001

#: ... unless this many are waiting already.
COALESCE_MAX: Final[int] = 32


@dataclass(slots=True, eq=False)
class ResultWrite:
    """One value to ``SET`` (a task result), with an optional expiry in ms."""

    key: str
    value: str
    px: int | None
    waiters: list[asyncio.Future[None]] | None = None

    def wait(self) -> asyncio.Future[None]:
        """Return a future resolved once this write was sent (or given up)."""
        future = asyncio.get_running_loop().create_future()
        if self.waiters is None:
            self.waiters = []
        self.waiters.append(future)
        return future

    def finish(self) -> None:
        """Wake everyone waiting for this write."""
        for future in self.waiters or ():
            if not future.done():
                future.set_result(None)
        self.waiters = None


#: Pending settlements: (token, move target or '' to delete) -> message IDs.
Settles = dict[tuple[str, str], list[int]]


class Committer:
    """Batches the result writes and acknowledgements of one event loop."""

    def __init__(
        self,
        runner: AsyncRedisRunner,
        *,
        on_written: Callable[[Sequence[ResultWrite]], None] | None = None,
        busy: Callable[[], bool] | None = None,
        retry_seconds: float = RETRY_SECONDS,
    ) -> None:
        self._runner = runner
        self._on_written = on_written
        self._busy = busy
        self._retry_seconds = retry_seconds
        self._writes: list[ResultWrite] = []
        self._settles: Settles = {}
        self._waiters: list[asyncio.Future[None]] = []
        self._task: asyncio.Task[None] | None = None

    def submit(
        self,
        writes: Sequence[ResultWrite] = (),
        token: str | None = None,
        message_id: int = 0,
        target: str = "",
    ) -> asyncio.Future[None]:
        """Queue ``writes`` and the settlement of one message; resolved when sent.

        ``target`` moves the message to that queue (dead-lettering) instead
        of deleting it. The future never raises: failures are logged.
        """
        if writes:
            self._writes.extend(writes)
        if token is not None:
            self._settles.setdefault((token, target), []).append(message_id)
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._waiters.append(future)
        if self._task is None:
            self._task = loop.create_task(self._run(), name="taskiq-simplebroker-commit")
        return future

    async def drain(self) -> None:
        """Wait until everything submitted so far was sent."""
        while self._task is not None:
            await asyncio.shield(self._task)

    async def _run(self) -> None:
        try:
            while self._waiters:
                if self._busy is not None and len(self._waiters) < COALESCE_MAX and self._busy():
                    await asyncio.sleep(COALESCE_SECONDS)
                writes, settles, waiters = self._writes, self._settles, self._waiters
                self._writes, self._settles, self._waiters = [], {}, []
                try:
                    await self._commit(writes, settles)
                finally:
                    if writes:
                        for write in writes:
                            write.finish()
                        if self._on_written is not None:
                            self._on_written(writes)
                    for future in waiters:
                        if not future.done():
                            future.set_result(None)
        finally:
            self._task = None

    async def _commit(self, writes: list[ResultWrite], settles: Settles) -> None:
        if not writes and not settles:
            return
        call = _commit_call(writes, settles)
        deadline = time.monotonic() + self._retry_seconds
        delay = BACKOFF_MIN
        # The reply of a try that happened but that too few replicas
        # confirmed (ReplicationTimeout): repeats only wait for replicas,
        # and find its messages settled already (lost, to them).
        happened: list[Settlement] | None = None
        while True:
            try:
                reply = await self._runner.run(call)
            except Exception as exc:
                if isinstance(exc, ReplicationTimeout) and happened is None:
                    happened = exc.result
                if not is_transient(exc) or time.monotonic() + delay > deadline:
                    self._gave_up(writes, settles, exc, happened is not None)
                    return
                logger.warning("saving results failed, retrying in %.1f s: %s", delay, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, BACKOFF_MAX)
                continue
            lost = sum(settlement.lost for settlement in happened or reply)
            if lost > 0:
                logger.warning(
                    "%d task(s) finished after their lease was lost; they may run again", lost
                )
            return

    def _gave_up(
        self, writes: list[ResultWrite], settles: Settles, exc: Exception, happened: bool
    ) -> None:
        count = (len(writes), sum(len(ids) for ids in settles.values()))
        if happened:
            logger.error(
                "saved %d result(s) and acknowledged %d task(s) on the primary, but no "
                "replica confirmed it within %g s: a failover may lose them (%s)",
                *count,
                self._retry_seconds,
                exc,
            )
        else:
            logger.error(
                "gave up saving %d result(s) and acknowledging %d task(s): %s", *count, exc
            )


def _commit_call(writes: list[ResultWrite], settles: Settles) -> calls.Call[list[Settlement]]:
    """Return the ``commit`` script call storing ``writes`` and settling ``settles``."""
    values = [ValueWrite(write.key, write.value, write.px) for write in writes]
    groups = [
        SettleGroup(token, "move" if target else "delete", target, tuple(ids))
        for (token, target), ids in settles.items()
    ]
    return calls.commit(values, groups)
