"""Write retry rules and automatic maintenance."""

from __future__ import annotations

import threading
import time

import pytest
from simplebroker import resolve_config

from simplebroker_redis import RedisRunner
from simplebroker_redis.core import RedisBrokerCore
from simplebroker_redis.keys import format_id


def test_repeated_id_collisions_back_off_and_stop_event_interrupts(redis_url, namespace, raw):
    stop = threading.Event()
    core = RedisBrokerCore(RedisRunner(redis_url, namespace=namespace), stop_event=stop)
    core.write("q", "warm")
    # Damaged data: a run of stored IDs just above the high-water mark, in a
    # grain two seconds ahead, so every retry meets the next stored ID.
    unit = (time.time_ns() + 2_000_000_000) // 4096
    planted = [unit * 4096 + i for i in range(1, 61)]
    for message_id in planted:
        raw.hset(f"sb:{{{namespace}}}:bodies", format_id(message_id), "ghost")
    raw.hset(f"sb:{{{namespace}}}:meta", "last_ts", format_id(unit * 4096))
    threading.Timer(0.3, stop.set).start()
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="conflicting attempts"):
        core.write("q", "blocked")
    assert time.monotonic() - started < 5
    assert [body for body, _ in core.peek_many("q", 10)] == ["warm"]


def test_transport_errors_are_not_retried(redis_url, namespace, raw):
    core = RedisBrokerCore(RedisRunner(redis_url, namespace=namespace))
    core.write("q", "warm")
    before = raw.info("commandstats").get("cmdstat_fcall", {}).get("calls", 0)
    core.runner.client.connection_pool.disconnect()  # idle sockets closed: fine
    core.write("q", "after reconnect")
    after = raw.info("commandstats")["cmdstat_fcall"]["calls"]
    assert after - before == 1
    assert len(core.peek_many("q", 10)) == 2


def test_automatic_maintenance_vacuums_and_recovers_without_being_asked(redis_url, namespace):
    config = resolve_config(
        override={"BROKER_AUTO_VACUUM_INTERVAL": 10, "BROKER_VACUUM_THRESHOLD": 10}
    )
    runner = RedisRunner(redis_url, namespace=namespace, stale_batch_seconds=0.05)
    holder = RedisBrokerCore(runner, config=config)
    for i in range(5):
        holder.write("stuck", f"s{i}")
    gen = holder.claim_generator("stuck", delivery_guarantee="at_least_once")
    next(gen)  # a batch that will go stale
    time.sleep(0.1)
    worker = RedisBrokerCore(RedisRunner(redis_url, namespace=namespace), config=config)
    for i in range(30):
        worker.write("busy", f"b{i}")
    for _ in range(30):
        worker.claim_one("busy")
    # Maintenance ran on the write/claim path: claimed rows are gone and the
    # stale batch of the quiet queue is pending again, nobody asked.
    assert worker.count_claimed_messages() < 30
    assert worker.get_queue_stat("stuck").pending == 5
    assert worker.claim_one("stuck") is not None
    gen.close()
