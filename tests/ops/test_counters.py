"""Counters kept by the scripts themselves: one per queue and event, exact."""

from __future__ import annotations

import time

import redis

from simplebroker_redis import RedisRunner
from simplebroker_redis.core import RedisBrokerCore
from simplebroker_redis.leases import Leases
from simplebroker_redis.ops.observe import read_namespace


def counts(runner: RedisRunner) -> dict[tuple[str, str], int]:
    return read_namespace(runner).counters


def test_every_transition_is_counted_once_per_message(
    broker: RedisBrokerCore, runner: RedisRunner
) -> None:
    for i in range(6):
        broker.write("jobs", f"job {i}")
    broker.write_delayed("jobs", "later", 600)
    broker.claim_one("jobs")  # a plain SimpleBroker read: consumed at once
    leases = Leases(runner)
    taken = leases.reserve("jobs", 2, lease_seconds=30, max_deliveries=1, dead_letter="jobs.dead")
    leases.ack(taken.token, taken.ids[:1])
    leases.release(taken.token)  # used its one delivery: dead-lettered
    handed = leases.reserve("jobs", 1, lease_seconds=30)
    leases.release(handed.token)
    rejected = leases.reserve("jobs", 1, lease_seconds=30, dead_letter="jobs.dead")
    leases.reject(rejected.token, None, "jobs.dead")
    stale = leases.reserve("jobs", 1, lease_seconds=0.01)
    time.sleep(0.03)
    assert leases.recover().released == 1
    del stale
    assert counts(runner) == {
        ("jobs", "enqueued"): 7,
        ("jobs", "acknowledged"): 2,
        ("jobs", "delivered"): 5,
        ("jobs", "dead_lettered"): 2,
        ("jobs", "released"): 1,
        ("jobs", "recovered"): 1,
    }


def test_batches_and_broadcasts_count_per_queue(
    broker: RedisBrokerCore, runner: RedisRunner
) -> None:
    broker.write("a", "1")
    broker.write("b", "1")
    broker.broadcast("hello")
    got = counts(runner)
    assert (got[("a", "enqueued")], got[("b", "enqueued")]) == (2, 2)


def test_a_damaged_counter_stops_counting_but_never_fails_an_operation(
    broker: RedisBrokerCore, runner: RedisRunner, raw: redis.Redis
) -> None:
    broker.write("jobs", "one")
    raw.hset(runner.keys.counters, "jobs enqueued", "not a number")
    broker.write("jobs", "two")  # still written
    assert list(broker.peek_many("jobs", 10, with_timestamps=False)) == ["one", "two"]
    raw.delete(runner.keys.counters)
    raw.set(runner.keys.counters, "wrong type")
    broker.write("jobs", "three")
    assert len(broker.peek_many("jobs", 10, with_timestamps=False)) == 3
