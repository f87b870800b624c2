"""Group commit: result writes and acknowledgements in one round trip.

A worker finishing a task must store its result and acknowledge the
message. The :class:`Committer` sends both in one ``commit`` script (results
first, then the settlements, validated before anything is written), and
batches: requests arriving while a round trip is in flight share the next
one, and while other tasks of the worker are still running it waits up to
:data:`COALESCE_SECONDS` for their acknowledgements too. A task finishing
alone is sent at once. Under load a worker therefore spends well under one
round trip, and one command, per task on results and acknowledgements.

A result is *fenced* by the reservation of its task (see :mod:`.deliveries`):
the script stores it only while that token still holds the message, checked
before anything is written, so a worker whose lease was taken over never
overwrites the result of the worker that holds the task now. Refused
results and refused acknowledgements are logged once per batch.

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

from simplebroker_redis import AsyncRedisRunner, OutcomeUnknown, ReplicationTimeout, calls
from simplebroker_redis.types import Committed, SettleGroup, ValueWrite

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
    #: (token, message ID) of the reservation whose task this is the result
    #: of: stored only while the token holds the message (None: stored as it is).
    fence: tuple[str, int] | None = None

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

#: Told, after a commit, whether the acknowledgement of IDs of a token held.
OnSettled = Callable[[str, list[int], bool], None]


class Committer:
    """Batches the result writes and acknowledgements of one event loop."""

    def __init__(
        self,
        runner: AsyncRedisRunner,
        *,
        on_written: Callable[[Sequence[ResultWrite]], None] | None = None,
        on_settled: OnSettled | None = None,
        busy: Callable[[], bool] | None = None,
        retry_seconds: float = RETRY_SECONDS,
    ) -> None:
        self._runner = runner
        self._on_written = on_written
        self._on_settled = on_settled
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
        happened: Committed | None = None
        # A try whose reply was lost may have applied the batch: a repeat
        # then finds its own settlements done (and refuses its results).
        unsure = False
        while True:
            try:
                reply = await self._runner.run(call)
            except Exception as exc:
                if isinstance(exc, ReplicationTimeout) and happened is None:
                    happened = exc.result
                unsure = unsure or isinstance(exc, OutcomeUnknown)
                if not is_transient(exc) or time.monotonic() + delay > deadline:
                    self._gave_up(writes, settles, exc, happened is not None)
                    return
                logger.warning("saving results failed, retrying in %.1f s: %s", delay, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, BACKOFF_MAX)
                continue
            self._settled(settles, happened or reply, unsure)
            return

    def _settled(self, settles: Settles, committed: Committed, unsure: bool) -> None:
        """Report what the commit refused, and each settlement's outcome.

        ``unsure``: an earlier try's reply was lost, so what this try found
        done may be that try's own work.
        """
        lost = sum(settlement.lost for settlement in committed.settlements)
        if unsure and (committed.refused or lost):
            logger.warning(
                "%d result(s) and %d acknowledgement(s) were found done or taken over when "
                "sent again after a lost reply: the lost try probably applied them (or their "
                "lease had been taken over by another worker)",
                committed.refused,
                lost,
            )
        else:
            if committed.refused:
                logger.warning(
                    "%d result(s) not stored: their task's lease had been taken over by "
                    "another worker (this one was stopped or cut off past its lease); the "
                    "result of the worker that holds the task stands",
                    committed.refused,
                )
            if lost > 0:
                logger.warning(
                    "%d acknowledgement(s) refused: the task finished after its lease was "
                    "taken over; it may run again (or ran) on another worker",
                    lost,
                )
        if self._on_settled is not None:
            for ((token, _), ids), settlement in zip(
                settles.items(), committed.settlements, strict=True
            ):
                self._on_settled(token, ids, settlement.lost == 0)

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


def _commit_call(writes: list[ResultWrite], settles: Settles) -> calls.Call[Committed]:
    """Return the ``commit`` script call storing ``writes`` and settling ``settles``."""
    values = [ValueWrite(write.key, write.value, write.px, write.fence) for write in writes]
    groups = [
        SettleGroup(token, "move" if target else "delete", target, tuple(ids))
        for (token, target), ids in settles.items()
    ]
    return calls.commit(values, groups)
