"""Dramatiq's ``tests/test_redis.py`` tests that read RedisBroker's private keys, rewritten.

Each asks what a client can see (which messages wait in a queue, which are
dead-lettered) through :func:`waiting` and :func:`dead`, which read
RedisBroker's keys on the ``redis`` side and the SimpleBroker queues on
ours; the tests themselves are the same on both sides. ``peer_suites/dramatiq/run.py``
copies this file into Dramatiq's ``tests/`` (it uses their fixtures).
"""

from __future__ import annotations

import os
import time
from unittest import mock

import dramatiq
import pytest
from dramatiq import Message
from dramatiq.brokers.redis import MAINTENANCE_SCALE, RedisBroker
from dramatiq.common import dq_name, xq_name
from dramatiq.errors import ConnectionClosed

from .common import worker


def _decode(raw) -> str:
    return Message.decode(raw if isinstance(raw, bytes) else raw.encode()).message_id


def waiting(broker, queue: str) -> set[str]:
    """Return the IDs of the messages waiting in ``queue`` (delayed ones included)."""
    if isinstance(broker, RedisBroker):
        found = set()
        for name in (queue, dq_name(queue)):
            ids = broker.client.lrange(f"{broker.namespace}:{name}", 0, -1)
            if ids:
                bodies = broker.client.hmget(f"{broker.namespace}:{name}.msgs", ids)
                found |= {_decode(body) for body in bodies if body}
        return found
    from simplebroker_redis import calls
    from simplebroker_redis.codec import decode_body

    found = set()
    for level in broker.levels(queue):
        for row in broker.runner.run(calls.peek(level, limit=10_000)):
            found.add(Message.decode(decode_body(row[0])).message_id)
    return found


def dead(broker, queue: str) -> set[str]:
    """Return the IDs of ``queue``'s dead-lettered messages."""
    if isinstance(broker, RedisBroker):
        bodies = broker.client.hvals(f"{broker.namespace}:{xq_name(queue)}.msgs")
        return {_decode(body) for body in bodies}
    from simplebroker_redis import calls
    from simplebroker_redis.codec import decode_body

    rows = broker.runner.run(calls.peek(xq_name(queue), limit=100_000))
    return {Message.decode(decode_body(row[0])).message_id for row in rows}


def expire_dead(broker) -> None:
    """Run the broker's expiry of dead messages now (each broker's own maintenance)."""
    if isinstance(broker, RedisBroker):
        broker.maintenance_chance = MAINTENANCE_SCALE
        broker.do_qsize("default")
    else:
        broker.store._next_expiry = 0
        broker.store._on_beat()


def test_redis_unacked_messages_can_be_requeued(redis_broker):
    redis_broker.declare_queue("some-queue")
    sent = {
        redis_broker.enqueue(
            Message(queue_name="some-queue", actor_name="a", args=(), kwargs={}, options={})
        ).message_id
        for _ in range(500)
    }
    consumer = redis_broker.consume("some-queue", prefetch=500, timeout=1000)
    taken = [next(consumer) for _ in range(500)]
    assert {message.message_id for message in taken} == sent
    consumer.requeue(taken)
    assert waiting(redis_broker, "some-queue") == sent
    consumer.close()


def test_redis_messages_can_be_dead_lettered(redis_broker, redis_worker):
    @dramatiq.actor(max_retries=0)
    def do_work():
        raise RuntimeError("failed")

    message = do_work.send()
    redis_broker.join(do_work.queue_name)
    redis_worker.join()
    assert dead(redis_broker, do_work.queue_name) == {message.message_id}


def test_redis_dead_lettered_messages_are_cleaned_up(redis_broker, redis_worker):
    @dramatiq.actor(max_retries=0)
    def do_work():
        raise RuntimeError("failed")

    for _ in range(200):
        do_work.send()
    redis_broker.join(do_work.queue_name)
    redis_worker.join()
    assert dead(redis_broker, do_work.queue_name)
    redis_broker.dead_message_ttl = 0
    expire_dead(redis_broker)
    assert not dead(redis_broker, do_work.queue_name)


def test_redis_messages_belonging_to_missing_actors_are_rejected(redis_broker, redis_worker):
    redis_broker.declare_queue("some-queue")
    message = redis_broker.enqueue(
        Message(queue_name="some-queue", actor_name="some-actor", args=(), kwargs={}, options={})
    )
    redis_broker.join("some-queue")
    redis_worker.join()
    assert message.message_id in dead(redis_broker, "some-queue")


def test_redis_requeues_unhandled_messages_on_shutdown(redis_broker):
    @dramatiq.actor
    def do_work():
        time.sleep(1)

    message_1 = do_work.send()
    message_2 = do_work.send()
    with worker(redis_broker, worker_threads=1):
        time.sleep(0.25)
    found = waiting(redis_broker, do_work.queue_name)
    assert found & {message_1.message_id, message_2.message_id}


def test_redis_requeues_unhandled_delay_messages_on_shutdown(redis_broker):
    @dramatiq.actor
    def do_work():
        pass

    message = do_work.send_with_options(delay=10000)
    with worker(redis_broker, worker_threads=1):
        pass
    assert message.message_id in waiting(redis_broker, do_work.queue_name)


def test_redis_broker_can_connect_via_url(redis_broker):
    if isinstance(redis_broker, RedisBroker):
        broker = RedisBroker(url=os.environ["PEER_URL"])
        assert broker.client.ping()
        return
    from dramatiq_simplebroker import SimpleBrokerDramatiqBroker

    broker = SimpleBrokerDramatiqBroker(url=redis_broker.settings.target.target)
    broker.declare_queue("q")
    broker.flush("q")
    broker.close()


def test_redis_broker_can_connect_via_client(redis_broker):
    if isinstance(redis_broker, RedisBroker):
        broker = RedisBroker(client=redis_broker.client)
        assert broker.client is redis_broker.client
        return
    from dramatiq_simplebroker import SimpleBrokerDramatiqBroker

    broker = SimpleBrokerDramatiqBroker(runner=redis_broker.runner)
    assert broker.runner is redis_broker.runner


@pytest.mark.parametrize("settle", ["ack", "nack"])
def test_redis_consumer_settle_can_retry_on_connection_error(redis_broker, redis_worker, settle):
    @dramatiq.actor(max_retries=0)
    def do_work(fail):
        if fail:
            raise RuntimeError

    do_work.send(settle == "nack")
    # The consumer thread makes its consumer when it starts (as Dramatiq's
    # test of issue 320 waits for it too).
    thread = redis_worker.consumers[do_work.queue_name]
    while (consumer := thread.consumer) is None:
        time.sleep(0.001)
    calls = []
    if isinstance(redis_broker, RedisBroker):
        target, name = consumer.broker, f"do_{settle}"
    else:
        target, name = consumer.store, "ack" if settle == "ack" else "dead_letter"
    original = getattr(target, name)

    def flaky(*args):
        calls.append(args)
        if len(calls) == 1:
            raise ConnectionClosed(RuntimeError("cut"))
        return original(*args)

    with mock.patch.object(target, name, side_effect=flaky):
        redis_broker.join(do_work.queue_name)
        redis_worker.join()
    assert len(calls) >= 2
    assert consumer.outstanding_message_count == 0
