"""Resharding under load: the namespace's slot moves to another primary and back.

While a writer, two exactly-once claimers, a Taskiq producer and a Taskiq
worker run, the slot that holds the namespace is migrated (keys moved with
MIGRATE, then SETSLOT NODE) to another primary and back, three times.
Scripts meet ASK, TRYAGAIN and MOVED meanwhile; nothing may be lost and
nothing claimed twice (the worker may run again only tasks in flight).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import Counter
from collections.abc import Iterator

import pytest
from redis.crc import key_slot
from taskiq.receiver import Receiver

from simplebroker_redis import RedisRunner, redis_backend_plugin
from simplebroker_redis.core import RedisBrokerCore
from simplebroker_redis.devserver import DevCluster
from simplebroker_redis.keys import Keyspace
from taskiq_simplebroker import SimpleBrokerResultBackend, SimpleBrokerTaskiqBroker

from .load import POOL_TIMEOUT, Claimer, Watcher, Writer, kick_loop

#: Round trips of the slot (there and back).
ROUND_TRIPS = 3


@pytest.fixture(scope="module")
def dev_cluster() -> Iterator[DevCluster]:
    """Three primaries, no replicas, a long node timeout: no failover can mix in."""
    with DevCluster(primaries=3, replicas=0, node_timeout_ms=15000) as cluster:
        yield cluster


async def test_moving_the_slot_and_back_loses_and_duplicates_nothing(
    dev_cluster: DevCluster,
) -> None:
    url, namespace = dev_cluster.url, f"rs-{os.getpid()}"
    slot = key_slot(Keyspace.for_namespace(namespace).meta.encode())
    home = dev_cluster.node_for_slot(slot)
    away = next(node for node in dev_cluster.primaries() if node is not home)
    runner = RedisRunner(url, namespace=namespace, pool_timeout=POOL_TIMEOUT)
    core = RedisBrokerCore(runner)
    watcher = Watcher(runner, "jobs")
    writer = Writer(url, namespace, "jobs", "w").start()
    claimers = [Claimer(url, namespace, "jobs").start() for _ in range(2)]

    worker = SimpleBrokerTaskiqBroker(
        url, namespace=namespace, lease_seconds=3.0, heartbeat_interval=0.5
    )
    ran: Counter[str] = Counter()

    @worker.task(task_name="record")
    async def record(key: str) -> None:
        ran[key] += 1

    producer = SimpleBrokerTaskiqBroker(url, namespace=namespace)
    producer.with_result_backend(SimpleBrokerResultBackend(runner=producer.runner))
    await producer.startup()
    worker.is_worker_process = True
    finish, stop_kicks = asyncio.Event(), asyncio.Event()
    listening = asyncio.create_task(Receiver(worker, max_async_tasks=50).listen(finish))
    kicked: list[str] = []
    kick_failed: Counter[str] = Counter()
    kicks = asyncio.create_task(
        kick_loop(
            lambda key: record.kicker().with_broker(producer).kiq(key),
            kicked,
            kick_failed,
            stop_kicks,
        )
    )
    started = time.monotonic()
    try:
        for _ in range(ROUND_TRIPS):
            for target in (away, home):
                await asyncio.sleep(0.3)
                await asyncio.to_thread(dev_cluster.migrate_slot, slot, target, batch=3)
        await asyncio.sleep(0.5)
        stop_kicks.set()
        await kicks
        await asyncio.to_thread(writer.stop)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and core.peek_one("jobs") is not None:
            await asyncio.sleep(0.05)
        for claimer in claimers:
            await asyncio.to_thread(claimer.stop)
        left = [str(body) for body in core.peek_generator("jobs", with_timestamps=False)]
        deadline = time.monotonic() + 30
        while set(kicked) - set(ran) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        before = watcher.wakeups
        woken = await asyncio.to_thread(
            watcher.woken_since, before, lambda: core.write("jobs", "last"), 10.0
        )
    finally:
        finish.set()
        await asyncio.wait_for(listening, 30)
        await worker.shutdown()
        await producer.shutdown()
        watcher.stop()
    claimed = Counter(body for claimer in claimers for body in claimer.got)
    lost = set(writer.acked) - set(claimed) - set(left)
    report = {
        "server": os.path.basename(dev_cluster.nodes[0].binary),
        "moves": 2 * ROUND_TRIPS,
        "seconds": round(time.monotonic() - started, 1),
        "writes_acked": len(writer.acked),
        "writes_lost": len(lost),
        "claimed_twice": sum(1 for n in claimed.values() if n > 1),
        "write_errors": dict(writer.failed),
        "claim_errors": dict(sum((c.failed for c in claimers), Counter())),
        "tasks_acked": len(kicked),
        "tasks_lost": len(set(kicked) - set(ran)),
        "tasks_run_twice": sum(1 for n in ran.values() if n > 1),
        "kick_errors": dict(kick_failed),
    }
    print("\nRESHARD REPORT " + json.dumps(report))
    core.close()
    redis_backend_plugin.cleanup_target(url, backend_options={"namespace": namespace})
    runner.shutdown()
    assert writer.acked and kicked and claimed
    assert not lost, f"acknowledged writes lost: {sorted(lost)[:10]}"
    assert report["claimed_twice"] == 0
    assert not writer.failed and not kick_failed, "a refusal surfaced instead of being retried"
    assert report["tasks_lost"] == 0
    assert woken, "the watcher did not wake after the slot moved"
