"""The Taskiq broker and result backend on a single server, a Redis Cluster and Sentinel.

Also ``shards=K``: one logical queue over K namespaces, spread evenly over
the cluster's primaries, every task run once and its result found from its
task ID alone.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from typing import Any

import pytest
from tqhelpers import receiving

from simplebroker_redis import AsyncLeases
from support.waiting import eventually
from taskiq_simplebroker import SimpleBrokerResultBackend, SimpleBrokerTaskiqBroker
from taskiq_simplebroker.shards import shard_index, shard_namespaces

#: Run on a single server, a Redis Cluster and a Sentinel group (tests/conftest.py).
TOPOLOGIES = ("single", "cluster", "sentinel")


def _broker(
    redis_url: str, namespace: str, shards: int, **options: Any
) -> SimpleBrokerTaskiqBroker:
    options.setdefault("lease_seconds", 2.0)
    options.setdefault("heartbeat_interval", 0.5)
    broker = SimpleBrokerTaskiqBroker(redis_url, namespace=namespace, shards=shards, **options)
    return broker.with_result_backend(
        SimpleBrokerResultBackend(runner=broker.runner, shards=shards)
    )


def _cleanup(redis_url: str, namespace: str, shards: int) -> None:
    from simplebroker_redis import redis_backend_plugin

    for name in shard_namespaces(namespace, shards):
        redis_backend_plugin.cleanup_target(redis_url, backend_options={"namespace": name})


@pytest.mark.parametrize("shards", [1, 3])
async def test_tasks_run_once_and_results_are_found_by_task_id(
    redis_url: str, namespace: str, shards: int
) -> None:
    worker = _broker(redis_url, namespace, shards)
    ran: Counter[int] = Counter()

    @worker.task(task_name="double")
    async def double(n: int) -> int:
        ran[n] += 1
        return 2 * n

    producer = _broker(redis_url, namespace, shards)
    await producer.startup()
    try:
        tasks = [await double.kicker().with_broker(producer).kiq(n) for n in range(45)]
        spread = Counter(shard_index(task.task_id, shards) for task in tasks)
        assert len(spread) == shards
        async with receiving(worker):
            results = [await task.wait_result(timeout=30) for task in tasks]
        assert [r.return_value for r in results] == [2 * n for n in range(45)]
        assert ran == Counter(range(45))
        # A client that knows only the task ID finds the result in its shard.
        reader = SimpleBrokerResultBackend(redis_url, namespace=namespace, shards=shards)
        await reader.startup()
        assert (await reader.get_result(tasks[7].task_id)).return_value == 14
        await reader.shutdown()
    finally:
        await producer.shutdown()
        _cleanup(redis_url, namespace, shards)


async def test_every_shard_recovers_a_dead_workers_tasks(redis_url: str, namespace: str) -> None:
    """A reservation left by a dead worker in any shard is recovered and run."""
    worker = _broker(redis_url, namespace, 3)
    done: list[int] = []

    @worker.task(task_name="note")
    async def note(n: int) -> None:
        done.append(n)

    producer = _broker(redis_url, namespace, 3)
    await producer.startup()
    try:
        tasks = [await note.kicker().with_broker(producer).kiq(n) for n in range(40)]
        for runner in producer.shard_runners:  # a "dead worker" holds every task
            await AsyncLeases(runner).reserve("taskiq", 100, lease_seconds=0.5)
        async with receiving(worker):
            await eventually(lambda: len(done) == 40, timeout=30)
        assert sorted(done) == list(range(40))
        assert len({shard_index(t.task_id, 3) for t in tasks}) == 3
    finally:
        await producer.shutdown()
        _cleanup(redis_url, namespace, 3)


async def test_mismatched_shards_are_refused(redis_url: str, namespace: str) -> None:
    from taskiq_simplebroker.errors import ConfigurationError

    broker = SimpleBrokerTaskiqBroker(redis_url, namespace=namespace, shards=3)
    broker.with_result_backend(SimpleBrokerResultBackend(runner=broker.runner))
    with pytest.raises(ConfigurationError, match="shards"):
        await broker.startup()
    await broker.shutdown()
    _cleanup(redis_url, namespace, 3)
    await asyncio.sleep(0)


def test_three_shards_land_on_three_primaries(shared_cluster: Any) -> None:
    """Only a cluster has several primaries, so this one runs there alone."""
    namespace = f"t-{uuid.uuid4().hex[:12]}"
    nodes = {shared_cluster.node_for_key(f"{{{name}}}") for name in shard_namespaces(namespace, 3)}
    assert len(nodes) == 3
