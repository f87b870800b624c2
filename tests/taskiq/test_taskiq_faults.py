"""Faults under real ``taskiq worker`` processes: kills, long tasks, poison, restarts."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path

import pytest
import redis
from tqhelpers import events, kiq

from simplebroker_redis import AsyncRedisRunner, Leases, RedisRunner
from simplebroker_redis.activity import AsyncActivity
from simplebroker_redis.core import RedisBrokerCore
from simplebroker_redis.devserver import DevServer, free_port
from support.waiting import eventually
from taskiq_simplebroker import (
    DeadLetteredError,
    SimpleBrokerResultBackend,
    SimpleBrokerTaskiqBroker,
)

# Worker-SIGKILL trials: their server side is the lease scripts, which every
# other test runs on each server binary.
pytestmark = pytest.mark.once

#: Lease settings of these tests' workers: a kill is noticed within ~1.2 s.
FAST = {"TQ_LEASE": "1.0", "TQ_HEARTBEAT": "0.2"}


async def test_sigkilled_worker_loses_nothing(start_worker, client, task_log):
    # The broker's default lease settings: the promise is "done within 15 s".
    # Four at a time each, so both workers get tasks.
    victim = start_worker(
        "--max-async-tasks",
        "4",
        env={"TQ_LEASE": "default", "TQ_NAME": "victim", "TQ_PREFETCH": "4"},
    )
    start_worker(
        "--max-async-tasks",
        "4",
        env={"TQ_LEASE": "default", "TQ_NAME": "survivor", "TQ_PREFETCH": "4"},
    )
    keys = [f"k{i}" for i in range(24)]
    tasks = [await kiq(client, "record", key, 0.4) for key in keys]

    def victim_busy() -> bool:
        started = {e.key for e in events(task_log, "start") if e.worker == "victim"}
        done = {e.key for e in events(task_log, "done") if e.worker == "victim"}
        return bool(started - done)

    await eventually(victim_busy, timeout=15, interval=0.01)
    victim.kill()
    killed_at = time.time()
    in_flight = {e.key for e in events(task_log, "start") if e.worker == "victim"} - {
        e.key for e in events(task_log, "done") if e.worker == "victim"
    }
    for task in tasks:
        result = await task.wait_result(check_interval=0.02, timeout=20)
        assert not result.is_err
    finished = max(e.at for e in events(task_log, "done"))
    assert finished - killed_at < 15, f"done {finished - killed_at:.1f} s after the kill"
    done = events(task_log, "done")
    assert {e.key for e in done} == set(keys), "a task was lost"
    assert in_flight, "the kill landed between tasks; nothing was in flight"
    # What the victim had in flight was redone by the survivor; nothing else ran twice.
    assert in_flight <= {e.key for e in done if e.worker == "survivor"}
    twice = {key for key, n in Counter(e.key for e in events(task_log, "start")).items() if n > 1}
    assert twice <= in_flight


async def test_long_tasks_are_not_redelivered_while_their_worker_lives(
    start_worker, client, task_log
):
    # Two workers: a task whose lease lapsed would be taken by the other one.
    start_worker(env={**FAST, "TQ_NAME": "a"})
    start_worker(env={**FAST, "TQ_NAME": "b"})
    blocking = await kiq(client, "block_loop", "blocking", 3.3)  # > 3 leases, loop blocked
    # Its worker's loop is blocked now, so the other worker takes the next one.
    await eventually(lambda: events(task_log, "start"), timeout=10, interval=0.01)
    sleeping = await kiq(client, "record", "sleeping", 3.3)
    for task in (blocking, sleeping):
        assert not (await task.wait_result(check_interval=0.05, timeout=20)).is_err
    await asyncio.sleep(1.2)  # one more lease: a lost lease would show up now
    starts = Counter(e.key for e in events(task_log, "start"))
    assert starts == {"blocking": 1, "sleeping": 1}


async def test_poison_and_rejected_tasks_go_to_the_dead_letter_queue(
    start_worker, client, task_log, redis_url, namespace
):
    worker = start_worker(env={"TQ_LEASE": "0.5", "TQ_HEARTBEAT": "0.1", "TQ_MAX_DELIVERIES": "2"})
    core = RedisBrokerCore(RedisRunner(redis_url, namespace=namespace))
    poison = await kiq(client, "poison", "p")
    refused = await kiq(client, "refuse", "r")

    def dead() -> list[str]:
        return [body for body, _ in core.peek_many("taskiq.dead", 10)]

    await eventually(lambda: len(dead()) == 2, timeout=20, interval=0.1)
    assert any(poison.task_id in body for body in dead())
    assert any(refused.task_id in body for body in dead())
    starts = Counter(e.key for e in events(task_log, "start"))
    assert starts == {"p": 2, "r": 1}  # the poison pill ran its two allowed deliveries
    assert core.peek_many("taskiq", 10) == []
    # Not silent: the poison pill's result says where it went and why, and
    # the worker (restarted after each crash) logged it.
    outcome = await poison.wait_result(check_interval=0.05, timeout=10)
    assert outcome.is_err and isinstance(outcome.error, DeadLetteredError), outcome
    assert "'taskiq.dead'" in str(outcome.error) and "after 2 deliveries" in str(outcome.error)

    def reported() -> list[str]:
        lines = worker.output().splitlines()
        return [line for line in lines if poison.task_id in line and "dead-letter" in line]

    [line] = await eventually(reported, timeout=5)
    assert "WARNING" in line and "dead-letter queue taskiq.dead after 2 deliveries" in line
    # The rejected task's own result (written with its rejection) stays.
    rejected = await refused.wait_result(check_interval=0.05, timeout=5)
    assert rejected.is_err and not isinstance(rejected.error, DeadLetteredError)
    # The worker still serves ordinary tasks.
    added = await kiq(client, "add", 20, 22)
    assert (await added.wait_result(check_interval=0.02, timeout=10)).return_value == 42


async def test_a_dead_letter_made_while_no_worker_runs_is_reported_once_at_start(
    start_worker, client, task_log, redis_url, namespace, raw
):
    env = {**FAST, "TQ_MAX_DELIVERIES": "1"}
    victim = start_worker(env={**env, "TQ_NAME": "victim"})
    task = await kiq(client, "record", "doomed", 60.0)
    await eventually(lambda: events(task_log, "start"), timeout=30, interval=0.02)
    victim.kill()  # no worker runs from here on
    # Its lease expires; any recovery (here: ours) dead-letters the task.
    leases = Leases(RedisRunner(redis_url, namespace=namespace))
    await eventually(lambda: leases.recover().released, timeout=10, interval=0.1)
    core = RedisBrokerCore(RedisRunner(redis_url, namespace=namespace))
    [(body, _)] = core.peek_many("taskiq.dead", 10)
    assert task.task_id in body
    assert not await client.result_backend.is_result_ready(task.task_id)

    workers = [start_worker(env={**env, "TQ_NAME": name}) for name in ("a", "b")]
    result = await task.wait_result(check_interval=0.05, timeout=30)
    assert result.is_err and isinstance(result.error, DeadLetteredError)
    assert "after 1 deliveries" in str(result.error)

    def reports() -> list[str]:
        return [
            line
            for worker in workers
            for line in worker.output().splitlines()
            if task.task_id in line and "dead-letter queue taskiq.dead" in line
        ]

    # Exactly one of the two workers logs it: whoever took the journal entry.
    [line] = await eventually(reports, timeout=10)
    assert "WARNING" in line
    await eventually(
        lambda: all("listening on" in worker.output() for worker in workers), timeout=30
    )
    assert raw.xlen(f"sb:{{{namespace}}}:dead_letters") == 0
    assert len(reports()) == 1


async def test_a_worker_started_before_its_server_waits_for_it(
    start_worker, namespace, task_log, tmp_path
):
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    worker = start_worker(env={**FAST, "SIMPLEBROKER_REDIS_URL": url})
    await eventually(lambda: "waiting for the server" in worker.output(), timeout=30)
    await asyncio.sleep(1.5)  # the outage goes on: the worker keeps trying, quietly
    server = DevServer(data_dir=str(tmp_path / "late"), port=port)
    server.start()
    producer = SimpleBrokerTaskiqBroker(url, namespace=namespace)
    producer.with_result_backend(SimpleBrokerResultBackend(runner=producer.runner))
    try:
        await producer.startup()
        task = await kiq(producer, "add", 1, 2)
        assert (await task.wait_result(check_interval=0.02, timeout=20)).return_value == 3
    finally:
        await producer.shutdown()
        worker.stop()
        server.stop()
    output = worker.output()
    assert output.count("waiting for the server") == 1, output  # one line for the outage
    assert "answers; starting to take tasks" in output
    assert "Traceback" not in output and "ERROR" not in output, output
    assert output.count("Started process worker-0") == 1, "the worker process was restarted"


@pytest.fixture
def restartable(tmp_path: Path):
    """A server with AOF (fsync always) that a test may kill and start again."""
    server = DevServer(
        data_dir=str(tmp_path / "aof"), appendonly=True, extra_args=["--appendfsync", "always"]
    )
    server.start()
    yield server
    server.stop()


async def _restart(server: DevServer, *, crash: bool) -> None:
    if crash:
        server.kill()
    else:
        server.stop(remove_data=False)
    await asyncio.sleep(0.8)
    server.start()


@pytest.mark.parametrize("busy", [False, True], ids=["idle", "busy"])
async def test_worker_survives_a_server_restart(
    start_worker, restartable, namespace, task_log, worker_env, busy
):
    worker = start_worker(env={**FAST, "SIMPLEBROKER_REDIS_URL": restartable.url})
    producer = SimpleBrokerTaskiqBroker(restartable.url, namespace=namespace)
    producer.with_result_backend(SimpleBrokerResultBackend(runner=producer.runner))
    await producer.startup()
    try:
        first = await kiq(producer, "record", "before", 0.0)
        await first.wait_result(check_interval=0.02, timeout=15)
        busy_tasks = [await kiq(producer, "record", f"b{i}", 0.3) for i in range(12 if busy else 0)]
        if busy:
            await eventually(lambda: events(task_log, "start")[1:], timeout=10, interval=0.01)
        await _restart(restartable, crash=busy)
        await asyncio.sleep(1.5)  # the worker meets the dead connections first
        after = await _kick_retrying(producer, "after")
        for task in [*busy_tasks, after]:
            assert not (await task.wait_result(check_interval=0.05, timeout=20)).is_err
    finally:
        await producer.shutdown()
    done = {e.key for e in events(task_log, "done")}
    assert done == {"before", "after", *(f"b{i}" for i in range(12 if busy else 0))}
    # Every task was acknowledged on the restarted server (its script cache
    # was empty: the commit pipeline's EVALSHA met NOSCRIPT and recovered).
    core = RedisBrokerCore(RedisRunner(restartable.url, namespace=namespace))
    await eventually(lambda: core.peek_many("taskiq", 100) == [], timeout=10)
    assert len({e.pid for e in events(task_log)}) == 1, "the worker process was restarted"
    assert worker.process.poll() is None


async def _kick_retrying(producer: SimpleBrokerTaskiqBroker, key: str):
    """Kick once; a pooled connection of the old server may fail the first try."""
    try:
        return await kiq(producer, "record", key, 0.0)
    except Exception:  # noqa: BLE001 - retried once, like a client would
        return await kiq(producer, "record", key, 0.0)


async def test_wakeups_reconnect_after_a_server_restart(restartable, namespace):
    runner = AsyncRedisRunner(restartable.url, namespace=namespace)
    wakeups = AsyncActivity(runner, ["q"])
    await wakeups.start()
    assert await wakeups.wait(0.5)  # the first subscription wakes once
    assert not await wakeups.wait(0.2)
    restartable.kill()
    await asyncio.sleep(0.3)
    restartable.start()
    started = time.monotonic()
    assert await wakeups.wait(5.0), "no wake-up after the reconnect"
    assert time.monotonic() - started < 2.0
    publisher = redis.Redis.from_url(restartable.url)
    assert await wakeups.wait(0.01) is False
    publisher.spublish(runner.keys.wake_channel("q"), "1")
    assert await wakeups.wait(2.0), "a publish after the restart was not seen"
    publisher.close()
    await wakeups.close()
    await runner.aclose()
