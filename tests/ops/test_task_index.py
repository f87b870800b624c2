"""The task index: a framework's task id finds its message in a few reads, in every state.

The scripts that write a message index it under the key its producer
names, the ones that delete it drop the entry: the index holds exactly the
messages that exist, whatever path they leave by, also with threads racing.
"""

from __future__ import annotations

import asyncio
import threading
import time

import redis

from simplebroker_redis import AsyncMessages, AsyncRedisRunner, RedisRunner, calls
from simplebroker_redis.core import RedisBrokerCore
from simplebroker_redis.leases import Leases
from simplebroker_redis.types import TaskLocation


def find(runner: RedisRunner, key: str, *elsewhere: str) -> TaskLocation | None:
    found = runner.run(calls.task_find([key], elsewhere=elsewhere)).found
    assert len(found) <= 1
    return found[0] if found else None


def index(raw: redis.Redis, runner: RedisRunner) -> dict[str, str]:  # raw decodes replies
    return dict(raw.hgetall(runner.keys.tasks))


def test_a_task_is_found_in_every_state_it_passes_through(
    broker: RedisBrokerCore, runner: RedisRunner, raw: redis.Redis
) -> None:
    first = broker.write("jobs", "run me", task_key="demo:t-1")
    where = find(runner, "demo:t-1")
    assert where is not None
    assert (where.id, where.state, where.queue, where.body) == (first, "pending", "jobs", "run me")
    leases = Leases(runner)
    lease = leases.reserve("jobs", 1, lease_seconds=30, dead_letter="jobs.dead")
    where = find(runner, "demo:t-1")
    assert where is not None and where.state == "reserved"
    assert (where.token, where.deliveries) == (lease.token, 1)
    assert where.until_us is not None and where.reserved_us is not None
    assert 29e6 <= where.until_us - where.reserved_us <= 30e6
    leases.reject(lease.token, None, "jobs.dead")
    # Moved: not where it was written; found in the queues it may have gone to.
    assert find(runner, "demo:t-1").state == "moved"  # type: ignore[union-attr]
    where = find(runner, "demo:t-1", "jobs.dead")
    assert where is not None and (where.state, where.queue) == ("pending", "jobs.dead")
    assert runner.run(calls.dead_letter_requeue("jobs.dead", "jobs")) == 1
    lease = leases.reserve("jobs", 1, lease_seconds=30)
    leases.ack(lease.token, None, delete=True)
    assert find(runner, "demo:t-1") is None
    assert index(raw, runner) == {}


def test_delayed_tasks_say_when_they_are_due(broker: RedisBrokerCore, runner: RedisRunner) -> None:
    broker.write_delayed("jobs", "later", 600)  # not indexed: no key
    message = asyncio.run(_write_async(runner, [("jobs", "later", 600.0, "demo:t-2")]))[0]
    where = find(runner, "demo:t-2")
    assert where is not None and (where.id, where.state) == (message, "delayed")
    lookup = runner.run(calls.task_find(["demo:t-2"]))
    assert where.until_us is not None
    assert 599e6 <= where.until_us - lookup.now_us <= 600e6


async def _write_async(runner: RedisRunner, items: list[tuple[str, str, float, str]]) -> list[int]:
    arunner = AsyncRedisRunner(runner.target, runner.options)
    writer = AsyncMessages(arunner)
    try:
        return list(
            await asyncio.gather(
                *(
                    writer.write(queue, body, delay_seconds=delay, task_key=key)
                    for queue, body, delay, key in items
                )
            )
        )
    finally:
        await arunner.aclose()


def test_group_commits_and_exact_inserts_index_each_message(
    broker: RedisBrokerCore, runner: RedisRunner, raw: redis.Redis
) -> None:
    items = [("a", f"body {i}", 0.0, f"demo:g-{i}" if i % 2 else "") for i in range(40)]
    ids = asyncio.run(_write_async(runner, items))
    for i, message in enumerate(ids):
        where = find(runner, f"demo:g-{i}")
        assert (where.id if where else None) == (message if i % 2 else None)
    top = broker.refresh_last_timestamp()
    broker.insert_messages([("b", "x", top + 10), ("b", "y", top + 20)], task_keys=["demo:i-1", ""])
    assert find(runner, "demo:i-1").id == top + 10  # type: ignore[union-attr]
    assert len(index(raw, runner)) == 2 * (20 + 1)


def test_a_task_sent_again_moves_its_key_and_the_old_message_leaves_it_alone(
    broker: RedisBrokerCore, runner: RedisRunner, raw: redis.Redis
) -> None:
    leases = Leases(runner)
    old = broker.write("jobs", "try 1", task_key="demo:retry")
    lease = leases.reserve("jobs", 1, lease_seconds=30)
    new = broker.write("jobs", "try 2", task_key="demo:retry")  # the retry, sent by the run
    leases.ack(lease.token, None, delete=True)  # the first run ends after it
    assert lease.ids == (old,)
    assert find(runner, "demo:retry").id == new  # type: ignore[union-attr]
    assert index(raw, runner) == {"k:demo:retry": f"{new:019d} jobs", f"i:{new:019d}": "demo:retry"}


def test_every_way_out_drops_the_entries(
    broker: RedisBrokerCore, runner: RedisRunner, raw: redis.Redis
) -> None:
    for i in range(3):
        broker.write("purged", "x", task_key=f"demo:p-{i}")
    one = broker.write("picked", "x", task_key="demo:d-1")
    two = broker.write("picked", "x", task_key="demo:d-2")
    three = broker.write("claimed", "x", task_key="demo:c-1")
    broker.delete("purged")
    broker.delete_message_ids("picked", [one])
    broker.claim_one("claimed")  # claimed: still stored, still found
    assert index(raw, runner) == {
        "k:demo:d-2": f"{two:019d} picked",
        f"i:{two:019d}": "demo:d-2",
        "k:demo:c-1": f"{three:019d} claimed",
        f"i:{three:019d}": "demo:c-1",
    }
    assert find(runner, "demo:c-1").state == "claimed"  # type: ignore[union-attr]
    broker.vacuum()
    assert find(runner, "demo:c-1") is None
    broker.delete()
    assert index(raw, runner) == {}


def test_a_damaged_index_never_fails_a_write_or_an_acknowledgement(
    broker: RedisBrokerCore, runner: RedisRunner, raw: redis.Redis
) -> None:
    raw.set(runner.keys.tasks, "wrong type")
    broker.write("jobs", "still written", task_key="demo:x")
    leases = Leases(runner)
    lease = leases.reserve("jobs", 1, lease_seconds=30)
    assert leases.ack(lease.token, None, delete=True).settled == 1
    assert raw.get(runner.keys.tasks) == "wrong type"


def _writer(url: str, namespace: str, n: int, count: int, errors: list[BaseException]) -> None:
    runner = RedisRunner(url, namespace=namespace)
    core = RedisBrokerCore(runner)
    try:
        for i in range(count):
            core.write("race", f"{n}-{i}", task_key=f"demo:{n}-{i}")
    except BaseException as exc:  # noqa: BLE001 - reported by the test
        errors.append(exc)
    finally:
        core.close()
        runner.shutdown()


def _worker(
    url: str, namespace: str, done: threading.Event, settled: list[int], errors: list[BaseException]
) -> None:
    runner = RedisRunner(url, namespace=namespace)
    leases = Leases(runner)
    try:
        while True:
            lease = leases.reserve("race", 7, lease_seconds=30)
            if lease.ids:
                settled.append(leases.ack(lease.token, None, delete=True).settled)
            elif done.is_set():
                return
            else:
                time.sleep(0.005)
    except BaseException as exc:  # noqa: BLE001 - reported by the test
        errors.append(exc)
    finally:
        runner.shutdown()


def test_racing_writers_and_workers_leave_an_empty_index(
    redis_url: str, namespace: str, raw: redis.Redis
) -> None:
    """Writers and workers in threads: every entry written, every one dropped."""
    per_writer, writers = 150, 3
    done = threading.Event()
    errors: list[BaseException] = []
    settled: list[int] = []
    threads = [
        threading.Thread(target=_writer, args=(redis_url, namespace, n, per_writer, errors))
        for n in range(writers)
    ]
    consumers = [
        threading.Thread(target=_worker, args=(redis_url, namespace, done, settled, errors))
        for _ in range(3)
    ]
    for thread in threads + consumers:
        thread.start()
    for thread in threads:
        thread.join(60)
    done.set()
    for thread in consumers:
        thread.join(60)
    assert not errors, errors
    assert sum(settled) == per_writer * writers
    runner = RedisRunner(redis_url, namespace=namespace)
    try:
        assert index(raw, runner) == {}
    finally:
        runner.shutdown()
