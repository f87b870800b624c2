"""The schedule source, alone and under a real ``taskiq scheduler`` process."""

from __future__ import annotations

import json
import time
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from simplebroker.ext import BrokerError
from taskiq.exceptions import TaskiqError
from taskiq.scheduler.scheduled_task import ScheduledTask
from tqhelpers import claims, events, scheduled

from simplebroker_redis import AsyncRedisRunner, RedisRunner
from simplebroker_redis.core import RedisBrokerCore
from support.waiting import eventually
from taskiq_simplebroker import (
    ConfigurationError,
    ScheduleError,
    SimpleBrokerScheduleSource,
    decode_body,
)
from taskiq_simplebroker.schedule_source import check_cron


@pytest.fixture
async def source(redis_url, namespace):
    schedules = SimpleBrokerScheduleSource(redis_url, namespace=namespace)
    yield schedules
    await schedules.shutdown()


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

    for item in items:  # what taskiq scheduler does around each send
        await source.pre_send(item)
        await source.post_send(item)
    # Cron and interval schedules stay; the claim of a fixed time removed it.
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


async def test_each_due_run_is_claimed_by_one_scheduler(schedulers):
    cron = scheduled("cron", cron="* * * * *")
    every = scheduled("interval", interval=1)
    once = scheduled("time", time=datetime.now(UTC))
    for task in (cron, every, once):
        await schedulers[0].add_schedule(task)
        won = [await claims(source, task) for source in schedulers]
        assert won == [True, False, False], task.args
        await schedulers[0].post_send(task)
        assert not await claims(schedulers[1], task), "a confirmed run was claimed again"
    # The one-off is gone with its claim; the next interval is claimable
    # once the interval (less half a second of slack) has passed.
    assert {s.args[0] for s in await schedulers[2].get_schedules()} == {"cron", "interval"}
    await eventually(lambda: claims(schedulers[2], every), timeout=3)
    assert not await claims(schedulers[0], every)


async def test_a_run_claimed_by_a_scheduler_that_died_is_sent_by_another(
    schedulers, raw, namespace
):
    dead, first, second = schedulers
    once = scheduled("once", time=datetime.now(UTC))
    cron = scheduled("cron", cron="* * * * *")
    for task in (once, cron):
        await first.add_schedule(task)
        assert await claims(dead, task)  # ... and it dies before sending
    assert [s.args[0] for s in await first.get_schedules()] == ["cron"]  # claims not expired
    assert not await claims(first, cron), "the dead scheduler's minute was claimed again"

    def lost(listed: list[ScheduledTask]) -> dict[str, ScheduledTask]:
        return {s.args[0]: s for s in listed if s.schedule_id != cron.schedule_id}

    async def both_lost() -> dict[str, ScheduledTask]:
        # The two claims were made one after the other; on a loaded machine
        # the first can expire a while before the second.
        found = lost(await first.get_schedules())
        return found if len(found) == 2 else {}

    retries = await eventually(both_lost, timeout=5)
    assert set(retries) == {"once", "cron"}
    assert retries["once"].schedule_id == f"{once.schedule_id}@once"
    assert all(r.time <= datetime.now(UTC) and r.cron is None for r in retries.values())
    await second.get_schedules()  # both see the lost runs; one sends each
    for retry in retries.values():
        assert await claims(first, retry)
        assert not await claims(second, retry)
        await first.post_send(retry)
    assert [s.args[0] for s in await second.get_schedules()] == ["cron"]
    assert raw.hlen(f"sb:{{{namespace}}}:schedule_claims") == 0


async def test_an_unreplicated_claim_is_still_sent_at_once(redis_url, namespace, raw):
    """``ReplicationTimeout`` on the claim: it happened, so the run is sent now, once."""
    runner = AsyncRedisRunner(redis_url, namespace=namespace, wait_replicas=5, wait_timeout=0.05)
    durable = SimpleBrokerScheduleSource(runner=runner)
    other = SimpleBrokerScheduleSource(redis_url, namespace=namespace)
    try:
        once = scheduled("once", time=datetime.now(UTC))
        await other.add_schedule(once)
        assert await claims(durable, once)
        assert not await claims(other, once)
        await durable.post_send(once)  # confirmed on the primary: no error
        assert raw.hlen(f"sb:{{{namespace}}}:schedule_claims") == 0
        assert await other.get_schedules() == []  # no lost run to send again
    finally:
        await other.shutdown()
        await runner.aclose()


async def test_deleted_schedules_and_mixed_kinds(source):
    gone = scheduled("gone", interval=5)
    await source.add_schedule(gone)
    await source.delete_schedule(gone.schedule_id)
    assert not await claims(source, gone), "a deleted schedule's run was claimed"
    with pytest.raises(ScheduleError, match="one of cron, interval and time"):
        await source.add_schedule(scheduled("both", cron="* * * * *", interval=5))
    with pytest.raises(ConfigurationError):
        SimpleBrokerScheduleSource(runner=source.runner, claim_seconds=0)


def sent(redis_url: str, namespace: str) -> list[tuple[str, float, str]]:
    """Return (key, time, schedule_id label) of every task the schedulers sent, in order."""
    core = RedisBrokerCore(RedisRunner(redis_url, namespace=namespace))
    try:
        rows = core.peek_many("taskiq", 10_000)
    finally:
        core.runner.shutdown()
    out = []
    for body, message_id in rows:
        message = json.loads(decode_body(body))
        out.append((message["args"][0], message_id / 1e9, message["labels"]["schedule_id"]))
    return out


async def test_three_schedulers_send_each_run_once_and_survive_a_kill(
    start_worker, schedulers, redis_url, namespace
):
    source = schedulers[0]  # claim_seconds=0.5, as the scheduler processes' below
    lost = scheduled("lost", time=datetime.now(UTC))
    await source.add_schedule(lost)
    assert await claims(source, lost)  # a scheduler claimed it, then died unsent
    await source.add_schedule(scheduled("interval", interval=1))
    await source.add_schedule(scheduled("cron", cron="* * * * *"))
    once = scheduled("once", time=datetime.now(UTC) + timedelta(seconds=3))
    await source.add_schedule(once)
    procs = [
        start_worker(
            "--update-interval",
            "1",
            command="scheduler",
            target="workerapp:ha_scheduler",
            env={"TQ_CLAIM_SECONDS": "0.5"},
        )
        for _ in range(3)
    ]
    await eventually(lambda: all("Startup completed" in p.output() for p in procs), timeout=60)

    def interval_sends() -> list[float]:
        return [at for key, at, _ in sent(redis_url, namespace) if key == "interval"]

    await eventually(lambda: len(interval_sends()) >= 3, timeout=20)
    procs[0].kill()  # mid-run: the others carry on
    killed_at = time.time()
    await eventually(
        lambda: (
            len([at for at in interval_sends() if at > killed_at]) >= 4
            and any(key == "once" for key, _, _ in sent(redis_url, namespace))
        ),
        timeout=20,
    )
    for proc in procs[1:]:
        proc.stop()

    runs = sent(redis_url, namespace)
    counts = Counter(key for key, _, _ in runs)
    assert counts["once"] == 1 and counts["lost"] == 1, counts
    [label] = [schedule_id for key, _, schedule_id in runs if key == "lost"]
    assert label == f"{lost.schedule_id}@once"  # sent as the retry of the lost run
    # The killed scheduler may have died between claiming a run and
    # confirming it: that run is sent again under a retry label (at least
    # once). Sends under the schedule's own ID are the claimed ones.
    ids = {key: s.schedule_id for s in await source.get_schedules() for key in s.args}
    assert set(ids) == {"interval", "cron"}  # the one-offs are gone, the others stay
    minutes = Counter(int(at // 60) for key, at, sid in runs if sid == ids["cron"])
    assert minutes and set(minutes.values()) == {1}, minutes  # one send per minute
    times = [at for key, at, sid in runs if sid == ids["interval"]]
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    # Never two sends of one interval: three schedulers tick at the same
    # whole seconds, so unclaimed they would send within milliseconds of one
    # another; claims are 0.5 s apart at least (send times add the write's
    # latency, hence the margin). And no run missed for long after the kill.
    assert min(gaps) > 0.25, gaps
    assert max(gaps) < 3.0, gaps
