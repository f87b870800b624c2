"""``SimpleBrokerScheduleSource``: ``taskiq scheduler`` schedules in the namespace.

Schedules (cron, fixed time, interval) are JSON documents in the namespace's
``schedules`` hash, one field per schedule ID, so every scheduler and every
producer sharing the namespace sees the same set, and SimpleBroker's
namespace cleanup removes them. A fixed-time schedule is deleted once the
scheduler sent it. Cron expressions are checked when a schedule is added
(``taskiq scheduler`` itself silently never fires an impossible one).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any, Final

from pydantic import ValidationError
from taskiq import ScheduleSource
from taskiq.cli.scheduler.run import CronValueError, is_cron_task_now
from taskiq.scheduler.scheduled_task import ScheduledTask

from simplebroker_redis.aio import AsyncRedisRunner

from .connection import close_runner, make_runner, pool_size
from .errors import ScheduleError

logger = logging.getLogger("taskiq_simplebroker")

#: Connection pool size of a source made from a URL (a scheduler sends little).
DEFAULT_MAX_CONNECTIONS: Final[int] = 10

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


class SimpleBrokerScheduleSource(ScheduleSource):
    """Stores Taskiq schedules in a SimpleBroker namespace.

    Args:
        url: Server URL (default ``$SIMPLEBROKER_REDIS_URL``, else the
            project's ``.broker.toml``; see :mod:`.connection`).
        runner: An existing :class:`~simplebroker_redis.aio.AsyncRedisRunner`
            to share, typically ``broker.runner``.
        namespace: SimpleBroker namespace of the schedules.
        max_connections: Size of the connection pool (when ``url`` is used;
            default 10); ``max_connection_pool_size`` is accepted too.
        connection_kwargs: redis-py connection options (see
            :data:`.connection.URL_OPTIONS`).

    """

    def __init__(
        self,
        url: str | None = None,
        *,
        runner: AsyncRedisRunner | None = None,
        namespace: str | None = None,
        max_connections: int | None = None,
        max_connection_pool_size: int | None = None,
        **connection_kwargs: Any,
    ) -> None:
        self._owns_runner = runner is None
        self.runner = make_runner(
            url,
            runner,
            namespace,
            pool_size(max_connections, max_connection_pool_size),
            connection_options=connection_kwargs,
            default_max_connections=DEFAULT_MAX_CONNECTIONS,
        )

    async def startup(self) -> None:
        """Create or validate the namespace."""
        await self.runner.ensure_initialized()

    async def shutdown(self) -> None:
        """Close this source's connections (when it owns its runner)."""
        if self._owns_runner:
            await close_runner(self.runner)

    async def get_schedules(self) -> list[ScheduledTask]:
        """Return every stored schedule (unreadable ones are logged and skipped)."""
        key = self.runner.keys.schedules
        stored = await self.runner.execute(lambda client: client.hgetall(key), idempotent=True)
        schedules = []
        for schedule_id, value in sorted(stored.items(), key=lambda item: str(item[0])):
            try:
                schedules.append(ScheduledTask.model_validate_json(value))
            except ValidationError as exc:
                logger.warning("skipping unreadable schedule %s: %s", schedule_id, exc)
        return schedules

    async def add_schedule(self, schedule: ScheduledTask) -> None:
        """Store ``schedule`` (replacing one with the same ``schedule_id``)."""
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
        await self.runner.execute(lambda client: client.hset(key, schedule.schedule_id, value))

    async def delete_schedule(self, schedule_id: str) -> None:
        """Delete a schedule (no error when it does not exist)."""
        key = self.runner.keys.schedules
        await self.runner.execute(lambda client: client.hdel(key, schedule_id))

    async def post_send(self, task: ScheduledTask) -> None:
        """Delete a fixed-time schedule once it was sent (it never fires again)."""
        if task.time is not None and task.cron is None and task.interval is None:
            await self.delete_schedule(task.schedule_id)
