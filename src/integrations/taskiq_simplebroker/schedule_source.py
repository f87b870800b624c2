"""``SimpleBrokerScheduleSource``: ``taskiq scheduler`` schedules in the namespace.

Schedules (cron, fixed time, interval) are JSON documents in the namespace's
``schedules`` hash, one field per schedule ID, so every scheduler and every
producer sharing the namespace sees the same set, and SimpleBroker's
namespace cleanup removes them. Cron expressions are checked when a
schedule is added (``taskiq scheduler`` itself silently never fires an
impossible one).

Any number of ``taskiq scheduler`` processes may share the source: each due
run is sent once. Taskiq's scheduler asks the source before every send
(``pre_send``) and tells it after (``post_send``). ``pre_send`` claims the
run in one script (``schedule_claim``): a cron run is its minute, an
interval run one interval by the server's clock, a fixed-time run the
schedule itself (the claim removes it). Schedulers that lose the race skip
the send. The claimed run waits, under a lease of ``claim_seconds``, until
``post_send`` confirms it; a claim whose lease expired unsent (its
scheduler died) is listed by ``get_schedules`` as a one-off run due now,
which the next scheduler to read the source claims again and sends.
Delivery of runs is therefore at least once: a scheduler killed between
sending and confirming (a few milliseconds) makes its run go out twice.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final, Unpack

from pydantic import ValidationError
from taskiq import ScheduleSource
from taskiq.cli.scheduler.run import CronValueError, is_cron_task_now
from taskiq.exceptions import ScheduledTaskCancelledError
from taskiq.scheduler.scheduled_task import ScheduledTask

from simplebroker_redis import ReplicationTimeout, calls
from simplebroker_redis.calls.schedules import LostRun, ScheduleKind
from simplebroker_redis.validation import number_problem

from .connection import ServerKeywords, close_runner, open_runner
from .errors import ConfigurationError, ScheduleError, is_transient

logger = logging.getLogger("taskiq_simplebroker")

#: Connection pool size of a source made from a URL (a scheduler sends little).
DEFAULT_MAX_CONNECTIONS: Final[int] = 10

#: Seconds a claimed run may stay unsent before another scheduler sends it.
DEFAULT_CLAIM_SECONDS: Final[float] = 30.0

# Day names only: the cron evaluator of ``taskiq scheduler`` (pycron) has no
# month names, so a schedule using them would never fire.
_DAYS: Final[dict[str, int]] = {
    name: i for i, name in enumerate("sun mon tue wed thu fri sat".split())
}

#: (lowest, highest, names) of the five cron fields.
_FIELDS: Final[tuple[tuple[int, int, dict[str, int]], ...]] = (
    (0, 59, {}),
    (0, 23, {}),
    (1, 31, {}),
    (1, 12, {}),
    (0, 7, _DAYS),
)


def _cron_value(text: str, low: int, high: int, names: dict[str, int]) -> bool:
    value = int(text) if text.isdigit() else names.get(text.lower())
    return value is not None and low <= value <= high


def _cron_item(item: str, low: int, high: int, names: dict[str, int]) -> bool:
    base, slash, step = item.partition("/")
    if slash and not (step.isdigit() and int(step) >= 1):
        return False
    if base == "*":
        return True
    start, dash, end = base.partition("-")
    if dash:
        return _cron_value(start, low, high, names) and _cron_value(end, low, high, names)
    return not slash and _cron_value(start, low, high, names)


def check_cron(expression: str) -> None:
    """Raise :class:`ScheduleError` unless ``expression`` is a valid five-field cron."""
    fields = expression.split()
    if len(fields) != len(_FIELDS):
        raise ScheduleError(f"cron {expression!r} must have five fields")
    for field, (low, high, names) in zip(fields, _FIELDS, strict=True):
        if not all(_cron_item(item, low, high, names) for item in field.split(",")):
            raise ScheduleError(f"cron {expression!r}: invalid field {field!r}")


def _kinds(schedule: ScheduledTask) -> list[str]:
    return [
        name
        for name, value in (
            ("cron", schedule.cron),
            ("interval", schedule.interval),
            ("time", schedule.time),
        )
        if value is not None
    ]


def _interval_us(interval: int | timedelta) -> int:
    seconds = interval.total_seconds() if isinstance(interval, timedelta) else interval
    return round(seconds * 1_000_000)


@dataclass(frozen=True, slots=True)
class _Claim:
    """A run this scheduler claimed and has not confirmed yet."""

    schedule_id: str
    run: str


class SimpleBrokerScheduleSource(ScheduleSource):
    """Stores Taskiq schedules in a SimpleBroker namespace; each due run is sent once.

    Args:
        url, server: As for the broker
            (:class:`~.broker.SimpleBrokerTaskiqBroker`; the keywords of
            :class:`~.connection.ServerKeywords`), but a pool made here has
            10 connections by default and takes no durability options
            (``wait_*``); typically ``runner=broker.runner``.
        claim_seconds: How long a claimed run may stay unsent (its scheduler
            died) before another scheduler sends it.

    """

    def __init__(
        self,
        url: str | None = None,
        *,
        claim_seconds: float = DEFAULT_CLAIM_SECONDS,
        **server: Unpack[ServerKeywords],
    ) -> None:
        problem = number_problem(claim_seconds, bound=0, side=">")
        if problem is not None:
            raise ConfigurationError(f"claim_seconds must be {problem}")
        self.claim_seconds = float(claim_seconds)
        self.runner, self._owns_runner = open_runner(
            url,
            server,
            owner=type(self),
            default_max_connections=DEFAULT_MAX_CONNECTIONS,
            backend_keywords=(),
        )
        self._lost: dict[str, LostRun] = {}  #: lost runs listed last, by their schedule_id
        self._claims: dict[str, _Claim] = {}  #: claimed runs not confirmed yet

    async def startup(self) -> None:
        """Create or validate the namespace."""
        await self.runner.ensure_initialized()

    async def shutdown(self) -> None:
        """Close this source's connections (when it owns its runner)."""
        if self._owns_runner:
            await close_runner(self.runner)

    async def get_schedules(self) -> list[ScheduledTask]:
        """Return every stored schedule, and each lost run as a one-off due now.

        A lost run was claimed by a scheduler that never confirmed sending
        it (it died). It is listed under the schedule ID
        ``"<schedule id>@<run>"`` with a ``time`` in the past, so the
        scheduler sends it at once (after claiming it again). Unreadable
        schedules are logged and skipped.
        """
        table = await self.runner.run(calls.schedule_list())
        schedules = []
        for schedule_id, value in sorted(table.schedules.items()):
            try:
                schedules.append(ScheduledTask.model_validate_json(value))
            except ValidationError as exc:
                logger.warning("skipping unreadable schedule %s: %s", schedule_id, exc)
        lost: dict[str, LostRun] = {}
        for run in table.lost:
            try:
                schedule = ScheduledTask.model_validate_json(run.schedule)
            except ValidationError as exc:
                logger.warning("skipping unreadable lost run of %s: %s", run.schedule_id, exc)
                continue
            retry_id = f"{run.schedule_id}@{run.run}"
            lost[retry_id] = run
            schedules.append(
                schedule.model_copy(
                    update={
                        "schedule_id": retry_id,
                        "cron": None,
                        "cron_offset": None,
                        "interval": None,
                        "time": datetime.fromtimestamp(run.claimed_us / 1_000_000, UTC),
                    }
                )
            )
        self._lost = lost
        return schedules

    async def add_schedule(self, schedule: ScheduledTask) -> None:
        """Store ``schedule`` (replacing one with the same ``schedule_id``).

        Raises:
            ScheduleError: An invalid cron expression or offset, or more
                than one of ``cron``, ``interval`` and ``time``.

        """
        kinds = _kinds(schedule)
        if len(kinds) > 1:
            raise ScheduleError(
                f"a schedule sets one of cron, interval and time, not {' and '.join(kinds)}"
            )
        if schedule.cron is not None:
            check_cron(schedule.cron)
            try:  # also checks the offset (a timezone name or a timedelta)
                is_cron_task_now(schedule.cron, datetime.now(UTC), schedule.cron_offset)
            except CronValueError as exc:
                raise ScheduleError(f"invalid cron {schedule.cron!r}: {exc}") from exc
        # The schedules hash is a fixed key of the namespace: the namespace
        # must exist (meta record first) before it holds anything.
        await self.runner.ensure_initialized()
        key = self.runner.keys.schedules
        value = schedule.model_dump_json()
        await self.runner.execute(
            lambda client: client.hset(key, schedule.schedule_id, value), writes=True
        )

    async def delete_schedule(self, schedule_id: str) -> None:
        """Delete a schedule (no error when it does not exist); no run of it is claimed after."""
        key = self.runner.keys.schedules
        await self.runner.execute(lambda client: client.hdel(key, schedule_id), writes=True)

    async def pre_send(self, task: ScheduledTask) -> None:
        """Claim this due run of ``task``; skip the send unless this scheduler got it.

        Raises:
            ScheduledTaskCancelledError: Another scheduler claimed the run,
                the schedule is gone, or the server cannot be reached.

        """
        kind: ScheduleKind
        run: str | int
        lost = self._lost.get(task.schedule_id)
        if lost is not None:
            schedule_id, kind, run = lost.schedule_id, "retry", lost.run
        else:
            schedule_id = task.schedule_id
            kind, run = self._due_run(task)
        try:
            claimed = await self.runner.run(
                calls.schedule_claim(schedule_id, kind, run, self.claim_seconds)
            )
        except ReplicationTimeout as exc:
            # The claim happened on the primary; skipping the send would only
            # delay the run by claim_seconds (sent then as a lost run).
            claimed = exc.result
        except Exception as exc:
            if not is_transient(exc):
                raise
            logger.warning("cannot claim a run of schedule %s, skipped: %s", schedule_id, exc)
            raise ScheduledTaskCancelledError from exc
        if claimed is None:
            logger.debug("a run of schedule %s is another scheduler's", schedule_id)
            raise ScheduledTaskCancelledError
        self._claims[task.schedule_id] = _Claim(schedule_id, claimed)

    async def post_send(self, task: ScheduledTask) -> None:
        """Confirm the run claimed in :meth:`pre_send` was sent (it is never sent again)."""
        claim = self._claims.pop(task.schedule_id, None)
        if claim is not None:
            self._lost.pop(task.schedule_id, None)
            try:
                await self.runner.run(calls.schedule_sent(claim.schedule_id, claim.run))
            except ReplicationTimeout as exc:  # confirmed on the primary
                logger.debug(
                    "run of schedule %s confirmed, unreplicated: %s", task.schedule_id, exc
                )

    @staticmethod
    def _due_run(task: ScheduledTask) -> tuple[ScheduleKind, str | int]:
        """Return the kind and run of the send Taskiq is about to make for ``task``.

        Taskiq checks cron first, then interval, then time; a cron run is
        its minute by this scheduler's clock (the clock Taskiq matched the
        expression against).
        """
        if task.cron is not None:
            return "cron", int(datetime.now(UTC).timestamp() // 60)
        if task.interval is not None:
            return "interval", _interval_us(task.interval)
        return "time", ""
