"""The result backend: Pub/Sub wake-ups, timeouts, failures, results stored with the ack."""

from __future__ import annotations

import threading
import time

import dramatiq
import pytest
from dramatiq import Message
from dramatiq.results import ResultFailure, ResultMissing, Results, ResultTimeout

from dramatiq_simplebroker import SimpleBrokerResultBackend
from simplebroker_redis.calls import dramatiq as room
from support.waiting import wait_for


@pytest.fixture
def backend(dq_broker):
    found = SimpleBrokerResultBackend(broker=dq_broker)
    dq_broker.add_middleware(Results(backend=found))
    return found


def _message(queue: str = "q") -> Message:
    return Message(queue_name=queue, actor_name="a", args=(), kwargs={}, options={})


def _record(runner) -> tuple[list[str], object]:
    """Record the scripts and plain commands run through ``runner`` (its ``run``)."""
    seen: list[str] = []
    run = runner.run

    def recording(call):
        seen.append(call.script or "command")
        return run(call)

    runner.run = recording
    return seen, run


def test_a_blocking_get_is_woken_by_the_store_not_by_polling(backend):
    message = _message()
    seen, run = _record(backend.runner)
    try:
        timer = threading.Timer(0.5, backend.store_result, (message, 42, 60_000))
        timer.start()
        started = time.monotonic()
        assert backend.get_result(message, block=True, timeout=10_000) == 42
        waited = time.monotonic() - started
        timer.join()
    finally:
        backend.runner.run = run
    assert 0.4 < waited < 9  # woken by the store, not by the 10 s timeout
    # A read before subscribing, one after (the result may have come in
    # between), one after the store's wake-up, and at most one after the
    # wake-up every waiter gets when the listener (re)connects; polling would
    # read about every 100 ms.
    assert seen.count("command") <= 4


def test_missing_and_timed_out_results(backend):
    message = _message()
    with pytest.raises(ResultMissing):
        backend.get_result(message)
    started = time.monotonic()
    with pytest.raises(ResultTimeout):
        backend.get_result(message, block=True, timeout=300)
    assert time.monotonic() - started < 5


def test_results_expire_after_their_ttl(backend):
    message = _message()
    backend.store_result(message, "x", 50)
    wait_for(lambda: _missing(backend, message), 10, "the result's expiry")


def _missing(backend, message) -> bool:
    try:
        backend.get_result(message)
    except ResultMissing:
        return True
    return False


def test_results_and_failures_of_a_worker(dq_broker, backend, make_worker):
    @dramatiq.actor(store_results=True)
    def add(x, y):
        return x + y

    @dramatiq.actor(store_results=True, max_retries=0)
    def fail():
        raise ValueError("no")

    make_worker(dq_broker)
    assert add.send(1, 2).get_result(block=True, timeout=20_000) == 3
    with pytest.raises(ResultFailure, match="ValueError"):
        fail.send().get_result(block=True, timeout=20_000)


def test_a_result_is_stored_with_its_acknowledgement(dq_broker, backend):
    @dramatiq.actor(store_results=True)
    def echo(x):
        return x

    message = echo.send("v")
    consumer = dq_broker.consume(echo.queue_name, prefetch=1, timeout=1000)
    held = next(consumer)
    backend.store_result(held, "v", 60_000)  # what the Results middleware does in a worker
    assert held.result is not None  # kept for the acknowledgement
    with pytest.raises(ResultMissing):
        backend.get_result(message)
    seen, run = _record(dq_broker.runner)
    try:
        consumer.ack(held)
    finally:
        dq_broker.runner.run = run
    assert seen == ["dramatiq_store"]  # one script: the result and the acknowledgement
    assert backend.get_result(message) == "v"
    assert dq_broker.store.count([echo.queue_name]) == 0
    consumer.close()


def test_an_acknowledgement_woken_while_its_message_ran_reserves_the_next(dq_broker, backend):
    @dramatiq.actor(store_results=True)
    def echo(x):
        return x

    first = echo.send(0)
    consumer = dq_broker.consume(echo.queue_name, prefetch=4, timeout=1000)
    held = next(consumer)
    later = [echo.send(1), echo.send(2)]
    # Their wake-ups reach the consumer while `held` runs: left to its acknowledgement.
    wait_for(lambda: consumer._wakeups.woken_at() is not None, timeout=10)
    backend.store_result(held, 0, 60_000)
    seen, run = _record(dq_broker.runner)
    try:
        consumer.ack(held)
        handed = [next(consumer), next(consumer)]
    finally:
        dq_broker.runner.run = run
    # One script acknowledged the first, stored its result and reserved the others.
    assert seen == ["dramatiq_store"]
    assert sorted(m.message_id for m in handed) == sorted(m.message_id for m in later)
    assert all(dq_broker.store.holdings.holds(m.token) for m in handed)
    assert backend.get_result(first) == 0
    for message in handed:
        backend.store_result(message, message.args[0], 60_000)
        consumer.ack(message)
    assert [backend.get_result(m) for m in later] == [1, 2]
    assert dq_broker.store.count([echo.queue_name]) == 0
    consumer.close()


def test_an_acknowledgement_after_close_reserves_nothing(dq_broker, backend):
    @dramatiq.actor(store_results=True)
    def echo(x):
        return x

    echo.send(0)
    consumer = dq_broker.consume(echo.queue_name, prefetch=4, timeout=1000)
    held = next(consumer)
    later = echo.send(1)
    wait_for(lambda: consumer._wakeups.woken_at() is not None, timeout=10)
    consumer.close()  # as Dramatiq's worker stops: its threads still acknowledge
    backend.store_result(held, 0, 60_000)
    consumer.ack(held)
    other = dq_broker.consume(echo.queue_name, prefetch=1, timeout=5000)
    taken = next(other)  # pending, not held by the closed consumer
    assert taken is not None and taken.message_id == later.message_id
    other.ack(taken)
    other.close()


def test_a_fenced_acknowledgement_stores_nothing_but_still_reserves(dq_broker, backend):
    dq_broker.declare_queue("q")
    dq_broker.enqueue(_message())
    consumer = dq_broker.consume("q", prefetch=1, timeout=1000)
    held = next(consumer)
    dq_broker.store.release(held.token, [held.storage_id], undeliver=False)  # lease lost
    dq_broker.enqueue(_message())
    stored = dq_broker.runner.run(
        room.dramatiq_store(
            dq_broker.runner.keys,
            backend.build_message_key(held),
            "stale",
            60_000,
            token=held.token,
            message_id=held.storage_id,
            reserve_from=consumer.sources,
            reserve_limit=5,
            lease_seconds=30,
        )
    )
    assert (stored.stored, stored.settled, stored.lost) == (False, 0, 1)
    with pytest.raises(ResultMissing):
        backend.get_result(held)
    assert stored.reserved is not None
    ids = [message.id for message in stored.reserved.messages]
    assert len(ids) == 2 and held.storage_id in ids  # the handed-back one and the new one
    for lease in stored.reserved.leases:
        dq_broker.store.leases.ack(lease.token, None, delete=True)
    assert dq_broker.store.count(["q"]) == 0
    consumer.close()


def test_a_reservation_with_a_result_needs_its_acknowledgement(dq_broker):
    with pytest.raises(ValueError, match="acknowledgement"):
        room.dramatiq_store(
            dq_broker.runner.keys, "k", "v", 1000, reserve_from=[("q", None)], reserve_limit=1
        )


def test_a_result_from_a_worker_whose_lease_was_taken_over_is_not_stored(dq_broker, backend):
    dq_broker.declare_queue("q")
    dq_broker.enqueue(_message())
    consumer = dq_broker.consume("q", prefetch=1, timeout=1000)
    held = next(consumer)
    # Its lease taken over: handed back and reserved by another worker.
    dq_broker.store.release(held.token, [held.storage_id], undeliver=False)
    other = dq_broker.consume("q", prefetch=1, timeout=1000)
    current = next(other)
    stale = dq_broker.runner.run(
        room.dramatiq_store(
            dq_broker.runner.keys,
            backend.build_message_key(held),
            "stale",
            60_000,
            token=held.token,
            message_id=held.storage_id,
        )
    )
    assert (stale.stored, stale.settled, stale.lost) == (False, 0, 1)
    with pytest.raises(ResultMissing):
        backend.get_result(held)
    backend.store_result(current, "fresh", 60_000)
    other.ack(current)
    assert backend.get_result(held) == "fresh"
    consumer.close()
    other.close()


def test_binary_encoders_round_trip(dq_broker):
    from dramatiq.encoder import PickleEncoder

    backend = SimpleBrokerResultBackend(broker=dq_broker, encoder=PickleEncoder())
    message = _message()
    backend.store_result(message, {b"\xff": {1, 2}}, 60_000)
    assert backend.get_result(message) == {b"\xff": {1, 2}}
