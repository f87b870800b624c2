"""Reporting one dead-letter journal entry: with each kind of result backend, exactly once."""

from __future__ import annotations

import logging
import uuid

import pytest
from taskiq.result_backends.dummy import DummyResultBackend
from tqhelpers import kiq

from simplebroker_redis import (
    AsyncLeases,
    AsyncRedisRunner,
    Leases,
    RedisRunner,
    redis_backend_plugin,
)
from taskiq_simplebroker import DeadLetteredError, SimpleBrokerResultBackend
from taskiq_simplebroker.deadletters import report_dead_letter


async def _dead_letter(client, redis_url, namespace):
    """Kick a task and dead-letter it (one delivery allowed, handed back unfinished)."""
    task = await kiq(client, "add", 1, 2)
    leases = Leases(RedisRunner(redis_url, namespace=namespace))
    lease = leases.reserve("taskiq", 1, 30, max_deliveries=1, dead_letter="taskiq.dead")
    leases.release(lease.token)
    [entry] = (await AsyncLeases(client.runner).dead_letters(["taskiq"])).entries
    return task, entry


def _reports(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "dead-letter queue" in r.getMessage()]


async def test_another_namespaces_backend_gets_the_result_after_the_acknowledgement(
    client, redis_url, namespace, caplog
):
    task, entry = await _dead_letter(client, redis_url, namespace)
    other = f"other-{uuid.uuid4().hex[:8]}"
    backend: SimpleBrokerResultBackend[object] = SimpleBrokerResultBackend(
        redis_url, namespace=other
    )
    try:
        assert backend.journal_write(task.task_id, None, client.runner) is None  # type: ignore[arg-type]
        caplog.set_level(logging.WARNING, "taskiq_simplebroker")
        for _ in range(2):  # a second worker finds the entry taken
            await report_dead_letter(
                entry,
                runner=client.runner,
                formatter=client.formatter,
                backend=backend,
                where="here",
                max_deliveries=1,
            )
        result = await backend.get_result(task.task_id)
        assert isinstance(result.error, DeadLetteredError)
        [line] = _reports(caplog)
        assert task.task_id in line and "its result is an error saying so" in line
    finally:
        await backend.shutdown()
        redis_backend_plugin.cleanup_target(redis_url, backend_options={"namespace": other})


@pytest.mark.parametrize("case", ["dummy backend", "message gone"])
async def test_reports_without_a_result(client, redis_url, namespace, broker, caplog, case):
    task, entry = await _dead_letter(client, redis_url, namespace)
    if case == "message gone":
        broker.delete("taskiq.dead")
        [entry] = (await AsyncLeases(client.runner).dead_letters(["taskiq"])).entries
        assert entry.body is None
    caplog.set_level(logging.WARNING, "taskiq_simplebroker")
    await report_dead_letter(
        entry,
        runner=client.runner,
        formatter=client.formatter,
        backend=DummyResultBackend() if case == "dummy backend" else client.result_backend,
        where="here",
        max_deliveries=1,
    )
    [line] = _reports(caplog)
    if case == "dummy backend":
        assert task.task_id in line and "no result backend" in line
    else:
        assert f"message {entry.id} of queue taskiq" in line and "it is gone" in line
    assert not await client.result_backend.is_result_ready(task.task_id)
    assert (await AsyncLeases(client.runner).dead_letters(["taskiq"])).entries == ()


async def test_an_unreplicated_acknowledgement_is_still_reported(
    client, redis_url, namespace, caplog
):
    """``ReplicationTimeout`` on the journal's acknowledgement: it happened, so this one reports."""
    task, entry = await _dead_letter(client, redis_url, namespace)
    durable = AsyncRedisRunner(redis_url, namespace=namespace, wait_replicas=5, wait_timeout=0.05)
    caplog.set_level(logging.WARNING, "taskiq_simplebroker")
    try:
        await report_dead_letter(
            entry,
            runner=durable,
            formatter=client.formatter,
            backend=client.result_backend,
            where="here",
            max_deliveries=1,
        )
    finally:
        await durable.aclose()
    [line] = _reports(caplog)
    assert task.task_id in line and "its result is an error saying so" in line
    result = await client.result_backend.get_result(task.task_id)
    assert isinstance(result.error, DeadLetteredError)
    assert (await AsyncLeases(client.runner).dead_letters(["taskiq"])).entries == ()
