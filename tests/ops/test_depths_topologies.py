"""The namespace snapshot and the dashboard's scripts on a cluster and behind Sentinel."""

from __future__ import annotations

from simplebroker_redis import RedisRunner, calls
from simplebroker_redis.core import RedisBrokerCore
from simplebroker_redis.leases import Leases
from simplebroker_redis.ops.observe import read_namespace

TOPOLOGIES = ("cluster", "sentinel")


def test_snapshot_inspect_and_requeue_reach_the_namespaces_primary(
    broker: RedisBrokerCore, runner: RedisRunner
) -> None:
    broker.write("jobs", "one")
    broker.write("jobs", "two")
    broker.write("jobs.dead", "died")
    lease = Leases(runner).reserve("jobs", 1, lease_seconds=30)
    state = read_namespace(runner)
    assert [(q.queue, q.pending, q.reserved) for q in state.queues] == [
        ("jobs", 1, 1),
        ("jobs.dead", 1, 0),
    ]
    assert state.counters[("jobs", "enqueued")] == 2
    view = runner.run(calls.inspect("jobs", 10))
    reserved = {part.state: part for part in view.states}["reserved"]
    assert [m.token for m in reserved.messages] == [lease.token]
    assert runner.run(calls.dead_letter_requeue("jobs.dead", "jobs")) == 1
    assert read_namespace(runner).queue("jobs").pending == 2  # type: ignore[union-attr]
