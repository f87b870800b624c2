"""Priorities and several queues per worker: where tasks go, and the order workers take them."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

import pytest
from taskiq import Context, TaskiqDepends
from taskiq.acks import AckableMessage
from taskiq.exceptions import SendTaskError
from tqhelpers import events, kiq, make_broker, receiving

from simplebroker_redis import Leases, RedisRunner
from support.recording import record_scripts
from support.waiting import eventually
from taskiq_simplebroker import ConfigurationError, DeadLetteredError, SimpleBrokerTaskiqBroker


async def take(listener: Any, timeout: float = 5.0) -> AckableMessage:
    message = await asyncio.wait_for(anext(listener), timeout)
    assert isinstance(message, AckableMessage)
    return message


async def test_priority_labels_pick_a_queue_and_order_the_reservation(
    client, redis_url, namespace, broker
):
    kicked = [(0, "a"), (5, "b"), (9, "c"), (5, "d"), (0, "e"), (9, "f"), (7, "g")]
    for priority, key in kicked:
        labels = {"priority": str(priority)} if key == "d" else {"priority": priority}
        await kiq(client, "add", key, 0, **labels)
    # A SimpleBroker queue per priority: `broker list` counts them, `broker peek` shows them.
    stats = {s.queue: s.pending for s in broker.list_queue_stats()}
    assert stats == {"taskiq": 2, "taskiq.p5": 2, "taskiq.p7": 1, "taskiq.p9": 2}
    worker = make_broker(redis_url, namespace, prefetch=10)
    scripts = record_scripts(worker.runner)
    listener = worker.listen()
    got = [await take(listener) for _ in kicked]
    order = [worker.formatter.loads(message.data).args[0] for message in got]
    assert order == ["c", "f", "g", "b", "d", "a", "e"]  # highest first, FIFO within one
    assert scripts.count("reserve_queues") == 1  # the whole batch: one round trip
    for message in got:
        await message.ack()
    await listener.aclose()
    await worker.shutdown()
    assert broker.list_queue_stats() == []


@pytest.mark.parametrize("bad", [10, -1, "high", 2.5, True, "9 "])
async def test_a_priority_outside_0_to_9_is_refused_at_kick_time(client, broker, bad):
    if bad == "9 ":  # text that is a number in range is fine
        await kiq(client, "add", 1, 1, priority=bad)
        assert broker.peek_many("taskiq.p9", 10)
        return
    with pytest.raises(SendTaskError) as info:
        await kiq(client, "add", 1, 1, priority=bad)
    # The reason is in the error itself, not only in a cause Taskiq hides.
    assert isinstance(info.value, ConfigurationError)
    assert "'priority' must be an integer from 0 to 9" in str(info.value)
    assert broker.list_queue_stats() == []


@pytest.mark.parametrize(
    ("labels", "reason"),
    [
        ({"queue_name": "q" * 510, "priority": 5}, "label 'priority' 5: queue"),
        ({"delay": "soon"}, "label 'delay' must be seconds, got 'soon'"),
    ],
)
async def test_an_invalid_label_says_why_in_the_error_itself(client, broker, labels, reason):
    with pytest.raises(SendTaskError) as info:
        await kiq(client, "add", 1, 1, **labels)
    assert reason in str(info.value)
    assert isinstance(info.value, ConfigurationError)
    assert broker.list_queue_stats() == []  # nothing was written
    await kiq(client, "add", 1, 1, queue_name="my_queue")  # a valid label still routes
    assert [s.queue for s in broker.list_queue_stats()] == ["my_queue"]


async def test_priorities_off(client, redis_url, namespace, broker):
    plain = make_broker(redis_url, namespace, priorities=False)
    await plain.startup()
    with pytest.raises(SendTaskError) as info:
        await kiq(plain, "add", 1, 1, priority=3)
    assert "priorities=False" in str(info.value)
    await kiq(plain, "add", 1, 1, priority=0)
    scripts = record_scripts(plain.runner)
    listener = plain.listen()
    await (await take(listener)).ack()
    assert "reserve" in scripts and "reserve_queues" not in scripts  # one source: reserve.lua
    await listener.aclose()
    await plain.shutdown()


async def test_several_queues_in_strict_order_with_their_own_dead_letter_queues(
    client, redis_url, namespace, broker
):
    worker = make_broker(
        redis_url, namespace, queues=["urgent", "normal"], max_deliveries=1, prefetch=10
    )
    assert worker.queue == "urgent" and worker.dead_letter_queues == {
        "urgent": "urgent.dead",
        "normal": "normal.dead",
    }

    async def refuse(context: Annotated[Context, TaskiqDepends()]) -> None:
        context.reject()

    worker.register_task(refuse, task_name="workerapp:refuse")
    await kiq(client, "add", "n0", 0, queue_name="normal")
    await kiq(client, "add", "n9", 0, queue_name="normal", priority=9)
    await kiq(client, "add", "u0", 0, queue_name="urgent")
    await kiq(client, "add", "u1", 0, queue_name="urgent", priority=1)
    listener = worker.listen()
    got = [await take(listener) for _ in range(4)]
    order = [worker.formatter.loads(message.data).args[0] for message in got]
    assert order == ["u1", "u0", "n9", "n0"]  # queue order first, priorities within a queue
    for message in got:
        await message.ack()
    await listener.aclose()
    await worker.shutdown()

    # Dead letters go to the dead-letter queue of the queue a task came
    # from, and are reported from each queue (here: the worker dies on
    # their only delivery, the lease expires, a recovery dead-letters them).
    leases = Leases(RedisRunner(redis_url, namespace=namespace))
    doomed = [
        await kiq(client, "add", 1, 1, queue_name="normal", priority=4),
        await kiq(client, "add", 2, 2, queue_name="urgent"),
    ]
    sources = [("urgent", "urgent.dead"), ("normal.p4", "normal.dead")]
    held = leases.reserve_queues(sources, 10, 0.05, max_deliveries=1)
    assert [lease.queue for lease in held.leases] == ["urgent", "normal.p4"]
    await asyncio.sleep(0.1)
    assert leases.recover().released == 2
    assert [len(broker.peek_many(q, 10)) for q in ("urgent.dead", "normal.dead")] == [1, 1]
    rejected = await kiq(client, "refuse", queue_name="normal", priority=2)
    survivor = make_broker(redis_url, namespace, queues=["urgent", "normal"])
    survivor.register_task(refuse, task_name="workerapp:refuse")
    async with receiving(survivor):
        for task in doomed:
            result = await task.wait_result(check_interval=0.02, timeout=10)
            assert isinstance(result.error, DeadLetteredError), result
        assert (await rejected.wait_result(check_interval=0.02, timeout=10)).is_err
    assert len(broker.peek_many("normal.dead", 10)) == 2  # context.reject(): its queue's


async def test_names_taskiq_redis_takes_are_stored_one_to_one(client, redis_url, namespace, broker):
    """``taskiq:queue``, a space, a leading dot: stored escaped, each under a name of its own."""
    worker = make_broker(redis_url, namespace, queues=["taskiq:queue", "my queue", ".hidden"])
    assert worker.queues == ("taskiq-3Aqueue", "my-20queue", "_-2Ehidden")
    assert worker.dead_letter_queues["taskiq-3Aqueue"] == "taskiq-3Aqueue.dead"
    for name in ("taskiq:queue", "my queue", ".hidden", "taskiq-3Aqueue"):
        await kiq(client, "add", name, 0, queue_name=name)
    await kiq(client, "add", "urgent", 0, queue_name="taskiq:queue", priority=9)
    stats = {s.queue: s.pending for s in broker.list_queue_stats()}
    # The last name is valid as it is, yet not the escaped form of "taskiq:queue".
    assert stats == {
        "taskiq-3Aqueue": 1,
        "taskiq-3Aqueue.p9": 1,
        "my-20queue": 1,
        "_-2Ehidden": 1,
        "taskiq-2D3Aqueue": 1,
    }
    listener = worker.listen()
    got = [await take(listener) for _ in range(4)]
    order = [worker.formatter.loads(message.data).args[0] for message in got]
    assert order == ["urgent", "taskiq:queue", "my queue", ".hidden"]
    for message in got:
        await message.ack()
    await listener.aclose()
    await worker.shutdown()


def test_queue_options_are_validated(redis_url):
    bad: list[tuple[dict[str, Any], str]] = [
        ({"queue": "a", "queues": ["b"]}, "queue or queues"),
        ({"queues": []}, "non-empty"),
        ({"queues": "ab"}, "non-empty"),
        ({"queues": ["q", "q.p3"]}, "overlap"),
        ({"queues": ["q", "q.dead"]}, "dead-letter queue is also listened on"),
        ({"queues": ["a", "b"], "dead_letter_queue": "b"}, "dead-letter queue is also listened"),
        ({"queue": "q" * 511, "dead_letter_queue": "d"}, "exceeds 512"),  # q...q.p9 is too long
    ]
    for options, message in bad:
        with pytest.raises(ConfigurationError, match=message):
            SimpleBrokerTaskiqBroker(redis_url, **options)
    ok = SimpleBrokerTaskiqBroker(redis_url, queues=["q", "q.p3"], priorities=False)
    assert [queue for queue, _ in ok.sources] == ["q", "q.p3"]


async def test_a_worker_process_takes_queues_in_order_and_priorities_within(
    start_worker, client, task_log
):
    keys = []
    for queue, priority, key in [
        ("normal", 0, "n0-a"),
        ("normal", 9, "n9"),
        ("urgent", 0, "u0"),
        ("normal", 0, "n0-b"),
        ("urgent", 3, "u3"),
        ("normal", 5, "n5"),
    ]:
        await kiq(client, "record", key, 0.0, queue_name=queue, priority=priority)
        keys.append(key)
    # One task at a time, so the order it starts them is the order it took them.
    start_worker("--max-async-tasks", "1", env={"TQ_QUEUES": "urgent,normal", "TQ_PREFETCH": "3"})
    await eventually(lambda: len(events(task_log, "done")) == len(keys), timeout=30)
    order = [event.key for event in events(task_log, "start")]
    assert order == ["u3", "u0", "n9", "n5", "n0-a", "n0-b"]
