"""AsyncMessages: concurrent asyncio writes share round trips, each keeps its own outcome."""

from __future__ import annotations

import asyncio
import concurrent.futures
import multiprocessing
import threading
import time

import pytest
from simplebroker.ext import DataError, MessageError, QueueNameError

from simplebroker_redis import AsyncMessages, AsyncRedisRunner, RedisRunner
from simplebroker_redis.core import RedisBrokerCore
from support.recording import record_scripts


async def test_concurrent_writes_share_round_trips_and_keep_their_order(arunner, broker):
    messages = AsyncMessages(arunner)
    calls = record_scripts(arunner)
    ids = await asyncio.gather(*(messages.write("jobs", f"m{i}") for i in range(300)))
    # A write with nothing in flight goes alone; the rest share a few scripts.
    assert 2 <= len(calls) <= 5, calls
    assert set(calls) == {"write_batch"}
    assert len(set(ids)) == 300
    assert ids == sorted(ids), "IDs follow the order the writes were made"
    stored = broker.peek_many("jobs", 1000, with_timestamps=True)
    assert [body for body, _ in stored] == [f"m{i}" for i in range(300)]
    assert [ts for _, ts in stored] == ids


async def test_a_lone_write_is_one_round_trip_and_returns_its_id(arunner, broker):
    messages = AsyncMessages(arunner)
    calls = record_scripts(arunner)
    first = await messages.write("jobs", "one")
    second = await messages.write("jobs", "two")
    assert calls == ["write_batch", "write_batch"]
    assert second > first
    assert broker.peek_many("jobs", 10, with_timestamps=True) == [("one", first), ("two", second)]


async def test_one_batch_writes_to_many_queues_and_wakes_each(arunner, raw, namespace):
    pubsub = raw.pubsub()
    pubsub.ssubscribe(*(f"sb:{{{namespace}}}:wake:q{i}" for i in range(3)))  # wake-ups are sharded
    for _ in range(3):
        assert pubsub.get_message(timeout=5)["type"] == "ssubscribe"
    messages = AsyncMessages(arunner)
    await asyncio.gather(*(messages.write(f"q{i % 3}", str(i)) for i in range(30)))
    channels = set()
    while (msg := pubsub.get_message(timeout=0.5)) is not None:
        channels.add(msg["channel"].rsplit(":", 1)[-1])
    pubsub.close()
    assert channels == {"q0", "q1", "q2"}
    assert sorted(raw.zrange(f"sb:{{{namespace}}}:queues", 0, -1)) == ["q0", "q1", "q2"]
    assert raw.zcard(f"sb:{{{namespace}}}:pending") == 30


async def test_delayed_and_immediate_writes_in_one_batch(arunner, broker):
    messages = AsyncMessages(arunner)
    writes = [
        messages.write("jobs", f"now{i}", delay_seconds=0)
        if i % 2
        else messages.write("jobs", f"later{i}", delay_seconds=30)
        for i in range(10)
    ]
    await asyncio.gather(*writes)
    # Peek shows delayed messages as pending (README); only the others are claimable.
    assert broker.get_queue_stat("jobs").pending == 10
    claimed = [body for body, _ in broker.claim_many("jobs", 20)]
    assert claimed == [f"now{i}" for i in (1, 3, 5, 7, 9)]


async def test_bad_input_is_refused_before_anything_is_queued(arunner, broker):
    messages = AsyncMessages(arunner, max_message_size=10)
    good = [messages.write("jobs", f"ok{i}") for i in range(5)]
    results = await asyncio.gather(
        *good,
        messages.write("bad name!", "x"),
        messages.write("jobs", "x" * 11),
        messages.write("jobs", "x", delay_seconds=float("nan")),
        return_exceptions=True,
    )
    assert all(isinstance(r, int) for r in results[:5])
    assert isinstance(results[5], QueueNameError)
    assert isinstance(results[6], MessageError)
    assert isinstance(results[7], ValueError)
    assert [body for body, _ in broker.peek_many("jobs", 20)] == [f"ok{i}" for i in range(5)]


async def test_a_failing_batch_fails_every_write_in_it_and_writes_nothing(arunner, raw, namespace):
    messages = AsyncMessages(arunner)
    await messages.write("jobs", "before")
    # Damage: pending, which every write of the batch adds to, is not a sorted
    # set; the script refuses before writing.
    pending = f"sb:{{{namespace}}}:pending"
    raw.rename(pending, pending + ":saved")  # the message written before, restored below
    raw.set(pending, "oops")
    results = await asyncio.gather(
        *(messages.write("jobs", str(i)) for i in range(20)), return_exceptions=True
    )
    assert all(isinstance(r, DataError) and "expected a zset" in str(r) for r in results), results
    assert raw.get(pending) == "oops"
    raw.delete(pending)
    raw.rename(pending + ":saved", pending)
    assert raw.zcard(pending) == 1
    # The writer recovers once the damage is repaired.
    assert await messages.write("jobs", "after") > 0


async def test_a_spent_counter_is_awaited_without_blocking_the_loop(arunner, raw, namespace):
    # The durable high-water is 50 ms ahead of this clock, its logical counter
    # spent: the script refuses a stale candidate (CLOCK) until the clock
    # passes it, and the writer waits for that on the loop, not in a sleep.
    ahead = (time.time_ns() + 50_000_000) | 0xFFF
    raw.hset(f"sb:{{{namespace}}}:meta", "last_ts", f"{ahead:019d}")
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.005)
            ticks += 1

    ticker = asyncio.ensure_future(tick())
    try:
        committed = await AsyncMessages(arunner).write("jobs", "later")
    finally:
        ticker.cancel()
    assert committed > ahead
    assert ticks >= 3, "the event loop stood still while the write waited for the clock"


async def test_a_cancelled_write_that_was_not_sent_is_dropped(arunner, broker):
    messages = AsyncMessages(arunner)
    first = asyncio.ensure_future(messages.write("jobs", "sent"))
    await asyncio.sleep(0)  # first is in flight, alone
    queued = asyncio.ensure_future(messages.write("jobs", "cancelled"))
    kept = asyncio.ensure_future(messages.write("jobs", "kept"))
    await asyncio.sleep(0)
    queued.cancel()
    await first
    await kept
    with pytest.raises(asyncio.CancelledError):
        await queued
    assert [body for body, _ in broker.peek_many("jobs", 10)] == ["sent", "kept"]


async def test_a_writer_survives_a_new_event_loop(redis_url, namespace, broker):
    runner = AsyncRedisRunner(redis_url, namespace=namespace)
    messages = AsyncMessages(runner)

    async def burst(tag: str) -> list[int]:
        try:
            return await asyncio.gather(*(messages.write("jobs", f"{tag}{i}") for i in range(20)))
        finally:
            await runner.aclose()

    # pytest's loop is running; each run below uses a fresh loop in a thread.
    loop_ids = []
    for tag in ("a", "b"):
        loop_ids += await asyncio.to_thread(asyncio.run, burst(tag))
    assert len(set(loop_ids)) == 40
    assert broker.get_queue_stat("jobs").pending == 40


def _produce(url: str, namespace: str, tag: str, count: int) -> None:
    async def main() -> None:
        runner = AsyncRedisRunner(url, namespace=namespace)
        messages = AsyncMessages(runner)
        try:
            for start in range(0, count, 100):
                await asyncio.gather(
                    *(messages.write("race", f"{tag}:{i}") for i in range(start, start + 100))
                )
        finally:
            await runner.aclose()

    asyncio.run(main())


@pytest.mark.slow
def test_batching_producers_in_processes_lose_and_duplicate_nothing(redis_url, namespace):
    count = 1000
    ctx = multiprocessing.get_context("spawn")
    procs = [
        ctx.Process(target=_produce, args=(redis_url, namespace, f"p{k}", count)) for k in range(3)
    ]
    for proc in procs:
        proc.start()
    # A synchronous writer races them on the same high-water mark.
    core = RedisBrokerCore(RedisRunner(redis_url, namespace=namespace))
    for i in range(300):
        core.write("race", f"sync:{i}")
    for proc in procs:
        proc.join(120)
        assert proc.exitcode == 0
    rows = core.peek_many("race", 10_000, with_timestamps=True)
    bodies = [body for body, _ in rows]
    ids = [ts for _, ts in rows]
    assert len(ids) == len(set(ids)) == 3 * count + 300
    assert sorted(bodies) == sorted(
        [f"p{k}:{i}" for k in range(3) for i in range(count)] + [f"sync:{i}" for i in range(300)]
    )
    for tag in ("p0", "p1", "p2", "sync"):
        mine = [int(b.split(":")[1]) for b in bodies if b.startswith(tag + ":")]
        assert mine == sorted(mine), f"{tag} writes out of order"


def test_event_loops_in_two_threads_never_share_a_batch(redis_url, namespace, broker, raw):
    # One AsyncMessages (and runner) used by two threads, each with its own
    # event loop, at the same time: each loop batches its own writes on its
    # own connection pool, and closes only that pool.
    runner = AsyncRedisRunner(redis_url, namespace=namespace)
    messages = AsyncMessages(runner)
    start = threading.Barrier(2)
    connections_before = len(raw.client_list())

    def produce(tag: str) -> list[int]:
        async def burst() -> list[int]:
            out: list[int] = []
            try:
                for first in range(0, 300, 50):
                    out += await asyncio.gather(
                        *(messages.write("jobs", f"{tag}{i}") for i in range(first, first + 50))
                    )
            finally:
                await runner.aclose()
            return out

        start.wait(10)
        return asyncio.run(burst())

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        results = [pool.submit(produce, tag) for tag in ("a", "b")]
        ids = [committed for future in results for committed in future.result(timeout=60)]
    assert len(set(ids)) == 600
    deadline = time.monotonic() + 5  # the server notices closed sockets shortly after
    while len(raw.client_list()) > connections_before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(raw.client_list()) <= connections_before, raw.client_list()
    bodies = [body for body, _ in broker.peek_many("jobs", 1000)]
    for tag in ("a", "b"):
        assert [b for b in bodies if b.startswith(tag)] == [f"{tag}{i}" for i in range(300)]
