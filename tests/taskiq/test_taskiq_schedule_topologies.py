"""The HA schedule source on a Redis Cluster and behind Sentinel.

Schedules, the claim of each due run and the recovery of a run whose
scheduler died work the same on every topology (the single-server runs,
and the real ``taskiq scheduler`` processes, are test_taskiq_schedules.py).
"""

from __future__ import annotations

from datetime import UTC, datetime

from taskiq.scheduler.scheduled_task import ScheduledTask
from tqhelpers import claims, scheduled

from support.waiting import eventually

#: Run on the shared cluster and Sentinel group only (tests/conftest.py).
TOPOLOGIES = ("cluster", "sentinel")


async def test_each_due_run_is_sent_by_one_scheduler(schedulers, raw, namespace):
    cron = scheduled("cron", cron="* * * * *")
    once = scheduled("once", time=datetime.now(UTC))
    for task in (cron, once):
        await schedulers[0].add_schedule(task)
        assert [await claims(source, task) for source in schedulers] == [True, False, False]
        await schedulers[0].post_send(task)
    assert [s.args[0] for s in await schedulers[1].get_schedules()] == ["cron"]
    assert raw.hlen(f"sb:{{{namespace}}}:schedule_claims") == 0


async def test_a_run_whose_scheduler_died_is_sent_by_another(schedulers, raw, namespace):
    dead, first, second = schedulers
    once = scheduled("once", time=datetime.now(UTC))
    await first.add_schedule(once)
    assert await claims(dead, once)  # ... and it dies before sending

    async def lost() -> list[ScheduledTask]:
        return [s for s in await first.get_schedules() if s.args[0] == "once"]

    retry = (await eventually(lost, timeout=5))[0]
    assert retry.schedule_id == f"{once.schedule_id}@once"
    assert await claims(first, retry)
    assert not await claims(second, retry)
    await first.post_send(retry)
    assert await second.get_schedules() == []
    assert raw.hlen(f"sb:{{{namespace}}}:schedule_claims") == 0
