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
