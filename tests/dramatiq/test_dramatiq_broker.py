"""The broker's semantics in one process: delays, dead letters, retries, limits, priorities.

In-process Dramatiq workers (as Dramatiq's own tests run them) on the
suite's server, one namespace each; the worker-process behaviour (kills,
leases) is in test_dramatiq_worker.py.
"""

from __future__ import annotations

import threading
import time

import dramatiq
import pytest
from dramatiq import Message
from dramatiq.middleware import AgeLimit, TimeLimit

from dramatiq_simplebroker import ConfigurationError, SimpleBrokerDramatiqBroker
from simplebroker_redis import calls
from support.waiting import wait_for


def _stats(broker: SimpleBrokerDramatiqBroker, queue: str) -> tuple[int, int]:
    """Return (pending incl. delayed and reserved, claimable now) of a storage queue."""
    found = broker.runner.run(calls.stats(queue))
    pending = sum(item.pending for item in found)
    ready = broker.runner.run(calls.ready_count(broker.runner.keys, [queue]))
    return pending, int(ready)


def test_messages_run_and_the_queue_empties(dq_broker, make_worker):
    done = []

    @dramatiq.actor
    def put(n):
        done.append(n)

    for n in range(50):
        put.send(n)
    make_worker(dq_broker)
    dq_broker.join(put.queue_name, timeout=30_000)
    wait_for(lambda: len(done) == 50, 30, "every message")
    assert sorted(done) == list(range(50))
    assert dq_broker.store.count([put.queue_name]) == 0


def test_a_delay_is_kept_by_the_storage_not_by_a_delay_queue(dq_broker, make_worker):
    ran = []

    @dramatiq.actor
    def record():
        ran.append(time.monotonic())

    sent = time.monotonic()
    record.send_with_options(delay=1500)
    assert _stats(dq_broker, "default") == (1, 0)  # stored, not claimable yet
    make_worker(dq_broker)
    assert dq_broker.get_declared_delay_queues() == set()
    wait_for(lambda: ran, 30, "the delayed message")
    assert ran[0] - sent >= 1.4  # the server's clock: allow its granularity


def test_delays_order_by_due_time(dq_broker, make_worker):
    ran = []

    @dramatiq.actor
    def append(x):
        ran.append(x)

    append.send_with_options(args=(1,), delay=1200)
    append.send_with_options(args=(2,), delay=400)
    make_worker(dq_broker, worker_threads=1)
    wait_for(lambda: len(ran) == 2, 30, "both delayed messages")
    assert ran == [2, 1]


def test_a_failing_actor_retries_through_delayed_messages(dq_broker, make_worker):
    attempts = []

    @dramatiq.actor(min_backoff=100, max_backoff=200, max_retries=5)
    def flaky():
        attempts.append(time.monotonic())
        if len(attempts) < 3:
            raise RuntimeError("not yet")

    flaky.send()
    make_worker(dq_broker)
    wait_for(lambda: len(attempts) == 3, 30, "three attempts")
    dq_broker.join(flaky.queue_name, timeout=30_000)
    assert _stats(dq_broker, "default.XQ") == (0, 0)


def test_exhausted_retries_dead_letter_the_message(dq_broker, make_worker):
    @dramatiq.actor(max_retries=0)
    def fail():
        raise RuntimeError("always")

    message = fail.send()
    make_worker(dq_broker)
    wait_for(lambda: _stats(dq_broker, "default.XQ")[0] == 1, 30, "the dead letter")
    dq_broker.join(fail.queue_name, timeout=30_000)
    rows = dq_broker.runner.run(calls.peek("default.XQ", limit=1))
    assert message.message_id in str(rows)


def test_dead_messages_expire_after_dead_message_ttl(make_broker, make_worker):
    broker = make_broker(dead_message_ttl=1)

    @dramatiq.actor(max_retries=0)
    def fail():
        raise RuntimeError("always")

    for _ in range(3):
        fail.send()
    make_worker(broker)
    broker.join(fail.queue_name, timeout=30_000)
    assert _stats(broker, "default.XQ")[0] >= 1

    def expired() -> bool:
        # Each nack expires what died more than 1 ms before it; the heartbeat's
        # expiry pass (every minute) takes the rest.
        broker.store._next_expiry = 0
        broker.store._on_beat()
        return _stats(broker, "default.XQ") == (0, 0)

    wait_for(expired, 30, "the expiry of the dead messages")
    assert "default.XQ" not in broker.store.core.list_queues()


def test_dead_messages_younger_than_the_ttl_stay(dq_broker):
    dq_broker.declare_queue("q")
    dq_broker.enqueue(Message(queue_name="q", actor_name="a", args=(), kwargs={}, options={}))
    consumer = dq_broker.consume("q", prefetch=1, timeout=1000)
    consumer.nack(next(consumer))
    dq_broker.store._on_beat()
    assert _stats(dq_broker, "q.XQ") == (1, 1)
    consumer.close()


def test_a_message_of_an_unknown_actor_is_dead_lettered(dq_broker, make_worker):
    dq_broker.declare_queue("some-queue")
    dq_broker.enqueue(
        Message(queue_name="some-queue", actor_name="nobody", args=(), kwargs={}, options={})
    )
    make_worker(dq_broker)
    wait_for(lambda: _stats(dq_broker, "some-queue.XQ")[0] == 1, 30, "the dead letter")


def test_age_limit_dead_letters_old_messages(make_broker, make_worker):
    broker = make_broker()
    assert any(isinstance(m, AgeLimit) for m in broker.middleware)
    ran = []

    @dramatiq.actor(max_age=1)
    def old():
        ran.append(1)

    old.send()
    time.sleep(0.01)  # older than max_age (1 ms) before any worker starts: not a wait for readiness
    make_worker(broker)
    wait_for(lambda: _stats(broker, "default.XQ")[0] == 1, 30, "the dead letter")
    assert ran == []


def test_time_limit_interrupts_a_task(dq_broker, make_worker):
    assert any(isinstance(m, TimeLimit) for m in dq_broker.middleware)
    finished = threading.Event()

    @dramatiq.actor(time_limit=300, max_retries=0)
    def slow():
        for _ in range(200):
            time.sleep(0.05)
        finished.set()

    slow.send()
    make_worker(dq_broker)
    wait_for(
        lambda: _stats(dq_broker, "default.XQ")[0] == 1, 30, "the interrupted task's dead letter"
    )
    assert not finished.is_set()


def test_priorities_order_the_whole_queue_lowest_first(dq_broker, make_worker):
    ran = []

    @dramatiq.actor(priority=10)
    def later(n):
        ran.append(("later", n))

    @dramatiq.actor(priority=-5)
    def urgent(n):
        ran.append(("urgent", n))

    @dramatiq.actor
    def normal(n):
        ran.append(("normal", n))

    for n in range(3):
        later.send(n)
        normal.send(n)
        urgent.send(n)
    assert dq_broker.levels("default") == ["default.pm5", "default", "default.p10"]
    make_worker(dq_broker, worker_threads=1, worker_timeout=100)
    wait_for(lambda: len(ran) == 9, 30, "every message")
    assert [kind for kind, _ in ran] == ["urgent"] * 3 + ["normal"] * 3 + ["later"] * 3


def test_a_worker_that_keeps_dying_sends_the_message_to_the_dead_letter_queue(make_broker):
    broker = make_broker(max_deliveries=2)
    broker.declare_queue("q")
    broker.enqueue(Message(queue_name="q", actor_name="a", args=(), kwargs={}, options={}))
    consumer = broker.consume("q", prefetch=1, timeout=1000)
    for delivery in (1, 2):
        held = next(consumer)
        assert held.deliveries == delivery
        # As a worker that died: handed back with its delivery counted.
        broker.store.release(held.token, [held.storage_id], undeliver=False)
        consumer._out -= 1
    assert _stats(broker, "q") == (0, 0)
    assert _stats(broker, "q.XQ") == (1, 1)
    consumer.close()


def test_an_idle_consumer_sends_nothing_until_a_wake_up(dq_broker):
    dq_broker.declare_queue("idle")
    consumer = dq_broker.consume("idle", prefetch=2, timeout=300)
    scripts: list[str] = []
    run = dq_broker.runner.run

    def recording(call):
        if call.script is not None:
            scripts.append(call.script)
        return run(call)

    dq_broker.runner.run = recording  # type: ignore[method-assign]
    try:
        for _ in range(5):
            assert next(consumer) is None
        assert scripts.count("reserve_queues") == 1  # the first look only
        writer = SimpleBrokerDramatiqBroker(
            dq_broker.settings.target.target, namespace=dq_broker.runner.keys.namespace
        )
        writer.enqueue(Message(queue_name="idle", actor_name="a", args=(), kwargs={}, options={}))
        writer.close()
        consumer.timeout = 20.0  # woken by the write: long before this, and the 30 s recheck
        assert next(consumer) is not None
        assert scripts.count("reserve_queues") == 2
    finally:
        dq_broker.runner.run = run  # type: ignore[method-assign]
        consumer.close()


def test_requeue_hands_messages_back_uncounted(dq_broker):
    dq_broker.declare_queue("q")
    for _ in range(2):
        dq_broker.enqueue(Message(queue_name="q", actor_name="a", args=(), kwargs={}, options={}))
    consumer = dq_broker.consume("q", prefetch=2, timeout=1000)
    held = [next(consumer), next(consumer)]
    consumer.requeue(held)
    again = next(consumer)
    assert again.deliveries == 1
    consumer.close()


def test_flush_drops_pending_delayed_and_dead_messages(dq_broker):
    @dramatiq.actor(priority=3)
    def job():
        pass

    job.send()
    job.send_with_options(delay=60_000)
    dq_broker.flush_all()
    dq_broker.join(job.queue_name, timeout=200)
    assert dq_broker.store.core.list_queues() == []


def test_bad_settings_are_refused_by_name(redis_url):
    with pytest.raises(ConfigurationError, match="lease_seconds"):
        SimpleBrokerDramatiqBroker(redis_url, lease_seconds=0)
    with pytest.raises(ConfigurationError, match="max_deliveries"):
        SimpleBrokerDramatiqBroker(redis_url, max_deliveries=0)
    with pytest.raises(ConfigurationError, match="dead_message_ttl"):
        SimpleBrokerDramatiqBroker(redis_url, dead_message_ttl=-1)
    with pytest.raises(ConfigurationError):
        SimpleBrokerDramatiqBroker("redis:/127.0.0.1:1/0")


def test_a_simplebroker_scheme_url_is_accepted(redis_url, namespace):
    broker = SimpleBrokerDramatiqBroker("simplebroker+" + redis_url, namespace=namespace)
    assert broker.settings.target.target == redis_url
    broker.close()


def test_an_actor_of_a_new_priority_declared_while_consuming_is_read(dq_broker, make_worker):
    ran = []

    @dramatiq.actor
    def first():
        ran.append("first")

    make_worker(dq_broker)
    first.send()
    wait_for(lambda: ran == ["first"], 30, "the first actor's message")

    @dramatiq.actor(priority=7)
    def later():
        ran.append("later")

    later.send()
    wait_for(lambda: ran == ["first", "later"], 30, "the new level's message")


def test_a_message_whose_lease_was_lost_is_not_started(dq_broker):
    from dramatiq.middleware import SkipMessage

    dq_broker.declare_queue("q")
    for _ in range(2):
        dq_broker.enqueue(Message(queue_name="q", actor_name="a", args=(), kwargs={}, options={}))
    consumer = dq_broker.consume("q", prefetch=2, timeout=200)
    first = next(consumer)  # the second waits in the consumer's buffer
    # What the heartbeat does when a renewal finds the reservation gone (the
    # process was paused past its lease and another worker recovered it).
    dq_broker.store.holdings.drop([first.token])
    with pytest.raises(SkipMessage):
        dq_broker.emit_before("process_message", first)  # handed out: skipped before its task
    assert next(consumer) is None  # buffered: never handed out
    consumer.close()


#: What the broker logs only when a lease was lost (or taken for lost).
LOST_ALARMS = (
    "not started",
    "after its lease expired",
    "ran out before this process could renew",
)


def test_an_acknowledgement_racing_with_a_renewal_is_not_reported_as_a_lost_lease(
    dq_broker, caplog
):
    """The heartbeat's renewal may run just after the server settled a token's last message."""
    dq_broker.declare_queue("q")
    dq_broker.enqueue(Message(queue_name="q", actor_name="a", args=(), kwargs={}, options={}))
    consumer = dq_broker.consume("q", prefetch=1, timeout=200)
    message = next(consumer)
    store = dq_broker.store
    heartbeat = store.heartbeat
    heartbeat.stop()  # this test runs the renewal itself, at the worst moment
    leases = store.leases
    ack = leases.ack

    def ack_then_renew(*args, **kwargs):
        settled = ack(*args, **kwargs)  # the server dropped the token
        heartbeat._renew(leases)  # the heartbeat thread's turn, before ack() returns
        return settled

    leases.ack = ack_then_renew
    with caplog.at_level("INFO", logger="dramatiq_simplebroker"):
        consumer.ack(message)
    assert not [alarm for alarm in LOST_ALARMS if alarm in caplog.text], caplog.text
    consumer.close()


def test_a_prefetched_message_starts_though_its_sibling_was_just_acknowledged(dq_broker):
    """Two messages of one reservation: settling the first never makes the second look lost."""
    dq_broker.declare_queue("q")
    for _ in range(2):
        dq_broker.enqueue(Message(queue_name="q", actor_name="a", args=(), kwargs={}, options={}))
    consumer = dq_broker.consume("q", prefetch=2, timeout=200)
    first, second = next(consumer), next(consumer)
    assert first.token == second.token
    consumer.ack(first)
    dq_broker.emit_before("process_message", second)  # the fence lets it start
    consumer.ack(second)
    consumer.close()


def test_quick_tasks_on_worker_threads_never_report_a_lease_lost(dq_broker, make_worker, caplog):
    """Worker threads settle while the heartbeat renews and the fence checks: no false alarm."""
    done = []

    @dramatiq.actor
    def quick(n):
        done.append(n)

    with caplog.at_level("INFO", logger="dramatiq_simplebroker"):
        for n in range(300):
            quick.send(n)
        make_worker(dq_broker, worker_threads=4)
        wait_for(lambda: len(done) == 300, 60, "every message")
    assert sorted(done) == list(range(300))
    assert not [alarm for alarm in LOST_ALARMS if alarm in caplog.text], caplog.text


def test_without_a_url_the_environment_then_the_project_config_name_the_server(
    redis_url, namespace, tmp_path, monkeypatch
):
    (tmp_path / ".broker.toml").write_text(
        f'version = 1\nbackend = "redis"\ntarget = "{redis_url}"\n\n'
        f'[backend_options]\nnamespace = "{namespace}"\n'
    )
    nested = tmp_path / "app"
    nested.mkdir()
    monkeypatch.chdir(nested)
    monkeypatch.delenv("SIMPLEBROKER_REDIS_URL", raising=False)
    for name in ("BROKER_BACKEND", "BROKER_BACKEND_TARGET"):
        monkeypatch.delenv(name, raising=False)
    broker = SimpleBrokerDramatiqBroker()
    assert (broker.settings.target.target, broker.runner.keys.namespace) == (redis_url, namespace)
    assert broker.settings.target.source.endswith(".broker.toml")
    broker.close()
    monkeypatch.setenv("SIMPLEBROKER_REDIS_URL", redis_url)
    broker = SimpleBrokerDramatiqBroker(namespace="other")
    assert broker.settings.target.source == "$SIMPLEBROKER_REDIS_URL"
    assert broker.runner.keys.namespace == "other"
    broker.close()
    monkeypatch.delenv("SIMPLEBROKER_REDIS_URL")
    monkeypatch.chdir(tmp_path.parent)
    (tmp_path / ".broker.toml").unlink()
    with pytest.raises(ConfigurationError, match="no server named"):
        SimpleBrokerDramatiqBroker()


def test_queue_names_go_through_the_integrations_mapping(dq_broker, make_worker):
    from simplebroker_redis.queue_names import shown_queue

    ran = []

    @dramatiq.actor(queue_name="jobs-AB", priority=-3)
    def job():
        ran.append(1)

    assert dq_broker.levels("jobs-AB") == ["jobs-2DAB.pm3", "jobs-2DAB"]
    assert shown_queue("jobs-2DAB.pm3") == "jobs-AB.pm3"
    job.send()
    make_worker(dq_broker)
    wait_for(lambda: ran == [1], 30, "the message of the escaped queue")
