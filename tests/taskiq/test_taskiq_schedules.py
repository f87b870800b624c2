"""The schedule source, alone and under a real ``taskiq scheduler`` process."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from simplebroker.ext import BrokerError
from taskiq.exceptions import TaskiqError
from taskiq.scheduler.scheduled_task import ScheduledTask
from tqhelpers import events, eventually

from taskiq_simplebroker import ScheduleError, SimpleBrokerScheduleSource
from taskiq_simplebroker.schedule_source import check_cron


@pytest.fixture
async def source(redis_url, namespace):
    schedules = SimpleBrokerScheduleSource(redis_url, namespace=namespace)
    yield schedules
    await schedules.shutdown()


def scheduled(key: str, **when) -> ScheduledTask:
    return ScheduledTask(task_name="workerapp:scheduled", labels={}, args=[key], kwargs={}, **when)


async def test_schedules_round_trip_in_the_namespace(source, namespace, raw):
    at = datetime.now(UTC) + timedelta(hours=1)
    items = [
        scheduled("cron", cron="*/5 * * * *", cron_offset="Europe/Paris"),
        scheduled("time", time=at),
        scheduled("interval", interval=timedelta(seconds=30)),
    ]
    for item in items:
        await source.add_schedule(item)
    stored = await source.get_schedules()
    assert {s.schedule_id: s for s in stored} == {s.schedule_id: s for s in items}
    assert raw.hlen(f"sb:{{{namespace}}}:schedules") == 3

    await source.post_send(items[0])  # cron and interval schedules stay
    await source.post_send(items[2])
    await source.post_send(items[1])  # a fixed time fires once
    assert {s.args[0] for s in await source.get_schedules()} == {"cron", "interval"}
    await source.delete_schedule(items[0].schedule_id)
    await source.delete_schedule("unknown")
    assert [s.args[0] for s in await source.get_schedules()] == ["interval"]


@pytest.mark.parametrize(
    "cron",
    ["*/5 * * * *", "0 9-17 * * mon-fri", "0 0 1,15 * *", "30 2 * 1-6/2 0", "0 0 * * 7"],
)
def test_valid_cron_expressions(cron):
    check_cron(cron)


@pytest.mark.parametrize(
    "cron",
    [
        "61 * * * *",
        "* * *",
        "* * * 13 *",
        "*/0 * * * *",
        "5/2 * * * *",
        "* * * jan *",
        "@daily",
        "* * 0 * *",
        "1-x * * * *",
    ],
)
async def test_invalid_cron_is_refused_when_added(source, cron):
    with pytest.raises(ScheduleError) as info:
        await source.add_schedule(scheduled("bad", cron=cron))
    assert isinstance(info.value, TaskiqError) and isinstance(info.value, BrokerError)
    assert await source.get_schedules() == []


async def test_invalid_cron_offset_is_refused(source):
    with pytest.raises(ScheduleError):
        await source.add_schedule(scheduled("bad", cron="* * * * *", cron_offset="Mars/Base"))


async def test_unreadable_entries_are_skipped(source, namespace, raw):
    good = scheduled("ok", interval=10)
    await source.add_schedule(good)
    raw.hset(f"sb:{{{namespace}}}:schedules", "junk", json.dumps({"task_name": 1}))
    assert [s.schedule_id for s in await source.get_schedules()] == [good.schedule_id]


async def test_taskiq_scheduler_fires_cron_time_and_interval(
    start_worker, source, task_log, redis_url, namespace
):
    await source.add_schedule(scheduled("interval", interval=1))
    once = scheduled("time", time=datetime.now(UTC) + timedelta(seconds=2))
    await source.add_schedule(once)
    await source.add_schedule(scheduled("cron", cron="* * * * *"))
    start_worker()
    start_worker(command="scheduler")

    def fired() -> Counter[str]:
        return Counter(e.key for e in events(task_log, "scheduled"))

    await eventually(lambda: fired()["time"] and fired()["interval"] >= 3, timeout=20)
    counts = fired()
    assert counts["time"] == 1
    for cron in ("cron", "label"):  # ours, and the task's label (LabelScheduleSource)
        minutes = [int(e.at // 60) for e in events(task_log, "scheduled") if e.key == cron]
        # "* * * * *" fires at start, then once in each later minute.
        assert minutes and len(minutes) == len(set(minutes)), (cron, minutes)
    remaining = {s.args[0] for s in await source.get_schedules()}
    assert remaining == {"interval", "cron"}, "the fixed-time schedule was not removed"
