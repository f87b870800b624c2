"""Idempotent writes, and what a write whose reply never came says.

A write may carry an idempotency key (``dedupe_key``): a second write with
the same key within its window stores nothing and returns the first one's
ID, in ``write.lua`` and in ``write_batch.lua`` (also twice in one batch).
A state change whose reply is lost after it was sent raises
``OutcomeUnknown`` (not "cannot reach"), within the command timeout; one
that could not even connect says nothing was sent.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from simplebroker import Queue
from simplebroker.ext import OperationalError

from simplebroker_redis import AsyncMessages, AsyncRedisRunner, OutcomeUnknown, RedisRunner
from simplebroker_redis.core import RedisBrokerCore
from simplebroker_redis.devserver import DevServer
from support.faultproxy import FaultProxy


def test_a_write_with_a_stored_key_returns_the_first_id_and_stores_nothing(broker, raw, namespace):
    first = broker.write("jobs", "a", dedupe_key="task-1")
    again = broker.write("jobs", "a (sent again)", dedupe_key="task-1")
    other = broker.write("jobs", "b", dedupe_key="task-2")
    assert again == first
    assert other > first
    assert broker.peek_many("jobs", 10, with_timestamps=True) == [("a", first), ("b", other)]
    ttl = raw.pttl(f"sb:{{{namespace}}}:sent:task-1")
    assert 0 < ttl <= 600_000


def test_the_key_expires_after_its_window(broker):
    first = broker.write("jobs", "a", dedupe_key="k", dedupe_seconds=0.05)
    deadline = time.monotonic() + 5
    while (second := broker.write("jobs", "a", dedupe_key="k", dedupe_seconds=0.05)) == first:
        assert time.monotonic() < deadline, "the key outlived its window"
        time.sleep(0.02)
    assert second > first
    assert len(broker.peek_many("jobs", 10)) == 2


@pytest.mark.parametrize("key", ["", "has space", "x" * 201, "tab\t"])
def test_a_malformed_key_is_refused_before_anything_is_written(broker, key):
    with pytest.raises(ValueError, match="idempotency key"):
        broker.write("jobs", "a", dedupe_key=key)
    assert broker.peek_many("jobs", 10) == []


async def test_a_batch_stores_each_key_once_also_within_the_batch(arunner, broker):
    messages = AsyncMessages(arunner)
    earlier = await messages.write("jobs", "t0", dedupe_key="t0")
    ids = await asyncio.gather(
        messages.write("jobs", "t1", dedupe_key="t1"),
        messages.write("jobs", "t0 again", dedupe_key="t0"),
        messages.write("jobs", "plain"),
        messages.write("jobs", "t1 again", dedupe_key="t1"),
        messages.write("jobs", "t2", dedupe_key="t2", delay_seconds=30),
    )
    assert ids[1] == earlier
    assert ids[3] == ids[0]
    assert len({earlier, ids[0], ids[2], ids[4]}) == 4
    bodies = sorted(body for body, _ in broker.peek_many("jobs", 10, with_timestamps=True))
    assert bodies == ["plain", "t0", "t1", "t2"]


@pytest.fixture
def proxy(server: DevServer) -> FaultProxy:
    with FaultProxy(("127.0.0.1", server.port)) as p:
        yield p


def test_a_write_whose_reply_is_lost_is_outcome_unknown_and_safe_to_repeat(
    proxy: FaultProxy, server: DevServer, namespace: str
) -> None:
    url = proxy.url() + "?socket_timeout=1"
    runner = RedisRunner(url, namespace=namespace)
    direct = RedisRunner(f"redis://127.0.0.1:{server.port}/0", namespace=namespace)
    try:
        core = RedisBrokerCore(runner)
        core.write("jobs", "warm-up")
        proxy.blackhole("to_client")  # requests reach the server, replies do not
        started = time.monotonic()
        with pytest.raises(OutcomeUnknown, match="outcome is unknown"):
            core.write("jobs", "task", dedupe_key="task-9")
        assert time.monotonic() - started < 5
        proxy.heal()
        again = core.write("jobs", "task", dedupe_key="task-9")
        stored = RedisBrokerCore(direct).peek_many("jobs", 10, with_timestamps=True)
        assert stored[1:] == [("task", again)], "stored once, under the first write's ID"
    finally:
        proxy.heal()
        runner.shutdown()
        direct.shutdown()


def test_queue_write_without_a_key_says_it_may_have_been_stored(
    proxy: FaultProxy, namespace: str
) -> None:
    runner = RedisRunner(proxy.url() + "?socket_timeout=1", namespace=namespace)
    try:
        queue = Queue("jobs", db_path=runner.broker_target, runner=runner)
        queue.write("warm-up")
        proxy.blackhole("to_client")
        with pytest.raises(OutcomeUnknown, match="message may have been stored"):
            queue.write("task")
    finally:
        proxy.heal()
        runner.shutdown()


def test_a_refused_connection_says_nothing_was_sent(proxy: FaultProxy, namespace: str) -> None:
    runner = RedisRunner(proxy.url() + "?socket_timeout=1", namespace=namespace)
    try:
        core = RedisBrokerCore(runner)
        core.write("jobs", "warm-up")
        proxy.reset(refuse=True)
        with pytest.raises(OperationalError, match="cannot reach") as raised:
            core.write("jobs", "task")
        assert not isinstance(raised.value, OutcomeUnknown)
    finally:
        proxy.heal()
        runner.shutdown()


async def test_an_async_write_whose_reply_is_lost_is_outcome_unknown(
    proxy: FaultProxy, server: DevServer, namespace: str
) -> None:
    runner = AsyncRedisRunner(proxy.url() + "?socket_timeout=1", namespace=namespace)
    direct = RedisRunner(f"redis://127.0.0.1:{server.port}/0", namespace=namespace)
    try:
        messages = AsyncMessages(runner)
        await messages.write("jobs", "warm-up")
        proxy.blackhole("to_client")
        with pytest.raises(OutcomeUnknown):
            await messages.write("jobs", "task", dedupe_key="t")
        proxy.heal()
        again = await messages.write("jobs", "task", dedupe_key="t")
        stored = RedisBrokerCore(direct).peek_many("jobs", 10, with_timestamps=True)
        assert stored[1:] == [("task", again)]
    finally:
        proxy.heal()
        await runner.aclose()
        direct.shutdown()
