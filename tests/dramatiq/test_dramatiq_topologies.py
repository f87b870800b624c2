"""Worker processes on each topology, through a server restart and a Sentinel failover.

``dramatiq dqapp`` workers on a single server, the suite's Redis Cluster
and its Sentinel group (the target forms every integration takes); a
server SIGKILLed and started again on its AOF; and a ``SENTINEL
FAILOVER`` of a private group while a worker runs. Every task sent is
done, with its result, and none runs twice unless it was in flight.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from dqhelpers import keys_of, sender_actors, start_worker
from dramatiq.results import Results

from dramatiq_simplebroker import SimpleBrokerDramatiqBroker, SimpleBrokerResultBackend
from simplebroker_redis.devserver import DevSentinelGroup
from support.waiting import wait_for

TOPOLOGIES = ("single", "cluster", "sentinel")

AOF_ALWAYS = {"appendonly": True, "extra_args": ["--appendfsync", "always"]}


def _sender(url: str, namespace: str) -> tuple[SimpleBrokerDramatiqBroker, object, object]:
    broker = SimpleBrokerDramatiqBroker(url, namespace=namespace, lease_seconds=2.0)
    backend = SimpleBrokerResultBackend(broker=broker)
    broker.add_middleware(Results(backend=backend))
    work, _ = sender_actors(broker)
    return broker, work, backend


def test_tasks_delays_and_results_on_each_topology(redis_url, namespace, children, tmp_path):
    log = tmp_path / "events.log"
    start_worker(children, redis_url, namespace, log, processes=1, threads=4)
    broker, work, backend = _sender(redis_url, namespace)
    try:
        messages = [work.send(f"k{i}") for i in range(20)]
        messages.append(work.send_with_options(args=("later",), delay=500))
        results = [m.get_result(backend=backend, block=True, timeout=60_000) for m in messages]
        assert results == [*(f"k{i}" for i in range(20)), "later"]
        assert set(keys_of(log, "done").values()) == {1}
    finally:
        broker.close()


def test_a_server_restart_loses_nothing(make_server, children, tmp_path):
    server = make_server("srv", **AOF_ALWAYS)
    namespace, log = f"dq-{uuid.uuid4().hex[:8]}", tmp_path / "events.log"
    start_worker(children, server.url, namespace, log, threads=2)
    broker, work, backend = _sender(server.url, namespace)
    first = [work.send(f"a{i}", 0.05) for i in range(20)]
    wait_for(lambda: keys_of(log, "done"), 60, "the first tasks")
    server.kill()
    server = make_server("srv", port=server.port, **AOF_ALWAYS)
    second = [work.send(f"b{i}") for i in range(20)]
    for message in first + second:
        message.get_result(backend=backend, block=True, timeout=90_000)
    done = keys_of(log, "done")
    assert set(done) == {*(f"a{i}" for i in range(20)), *(f"b{i}" for i in range(20))}
    assert max(done.values()) <= 2  # only a task in flight at the crash may run twice
    broker.close()


@pytest.fixture(scope="module")
def sentinel_group() -> Iterator[DevSentinelGroup]:
    with DevSentinelGroup(replicas=1) as group:
        yield group


def test_a_sentinel_failover_loses_nothing(sentinel_group, children, tmp_path: Path):
    url, namespace, log = sentinel_group.url, f"dq-{uuid.uuid4().hex[:8]}", tmp_path / "events.log"
    start_worker(children, url, namespace, log, threads=2)
    broker, work, backend = _sender(url, namespace)
    first = [work.send(f"a{i}", 0.05) for i in range(20)]
    wait_for(lambda: keys_of(log, "done"), 60, "the first tasks")
    sentinel_group.failover()
    second = [work.send(f"b{i}") for i in range(20)]
    for message in first + second:
        message.get_result(backend=backend, block=True, timeout=90_000)
    done = keys_of(log, "done")
    assert set(done) == {*(f"a{i}" for i in range(20)), *(f"b{i}" for i in range(20))}
    assert max(done.values()) <= 2
    broker.close()
