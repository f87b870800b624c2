"""The kombu transport on its own: reservations, rejects, recovery, wake-ups, bindings."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any
from unittest.mock import ANY

import pytest
from kombu import Connection, Consumer, Exchange, Producer, Queue

import celery_simplebroker  # noqa: F401 - registers the transport alias
from celery_simplebroker import storage_queue
from celery_simplebroker.transport import Transport
from simplebroker_redis import RedisBrokerCore, RedisRunner


@pytest.fixture
def options(namespace: str) -> dict[str, Any]:
    return {"namespace": namespace, "lease_seconds": 2.0}


@pytest.fixture
def conn(redis_url: str, options: dict[str, Any]) -> Iterator[Connection]:
    connection = Connection(f"simplebroker+{redis_url}", transport_options=options)
    yield connection
    connection.release()


@pytest.fixture
def core(redis_url: str, namespace: str) -> Iterator[RedisBrokerCore]:
    runner = RedisRunner(redis_url, namespace=namespace)
    yield RedisBrokerCore(runner)
    runner.shutdown()


def publish(conn: Connection, queue: str, *bodies: Any) -> None:
    producer = Producer(conn.default_channel)
    for body in bodies:
        producer.publish(body, routing_key=queue, serializer="json")


def test_a_celery_queue_is_a_readable_simplebroker_queue(conn, core):
    publish(conn, "jobs", {"n": 1}, {"n": 2})
    bodies = core.peek_many("jobs", 10, with_timestamps=False)
    assert len(bodies) == 2
    assert '"body": "{\\"n\\": 1}"' in bodies[0]  # JSON text, not base64
    assert conn.default_channel.queue_declare("jobs", passive=True).message_count == 2
    assert storage_queue("celery@host.celery.pidbox") == "celery-40host.celery.pidbox"


def test_reserved_messages_stay_until_acked_and_come_back_on_requeue(conn, core):
    publish(conn, "jobs", "a", "b")
    channel = conn.channel()
    first = channel.basic_get("jobs")
    assert first.payload == "a" and not first.delivery_info["redelivered"]
    # Held by this channel: still pending for SimpleBroker, but nobody else gets it.
    other = conn.clone().channel()
    second = other.basic_get("jobs")
    assert second.payload == "b"
    assert other.basic_get("jobs") is None
    first.reject(requeue=True)  # pending again at once, at its old place
    again = other.basic_get("jobs")
    assert again.payload == "a" and again.delivery_info["redelivered"]
    again.ack()
    second.ack()
    assert core.peek_many("jobs", 10) == []
    other.connection.client.release()


def test_reject_without_requeue_deletes_or_dead_letters(redis_url, namespace, core):
    options = {"namespace": namespace, "dead_letter_queue": "jobs.dead"}
    with Connection(f"simplebroker+{redis_url}", transport_options=options) as conn:
        publish(conn, "jobs", "poison")
        conn.default_channel.basic_get("jobs").reject(requeue=False)
        assert core.peek_many("jobs", 10) == []
        assert len(core.peek_many("jobs.dead", 10)) == 1
    plain = {"namespace": namespace}
    with Connection(f"simplebroker+{redis_url}", transport_options=plain) as conn:
        publish(conn, "other", "x")
        conn.default_channel.basic_get("other").reject(requeue=False)
        assert core.peek_many("other", 10) == []


def test_basic_recover_and_close_hand_back_unacked_messages(conn, core):
    publish(conn, "jobs", *range(5))
    channel = conn.channel()
    held = [channel.basic_get("jobs") for _ in range(3)]
    assert [m.payload for m in held] == [0, 1, 2]
    channel.basic_recover(requeue=True)  # released at once, one script per reservation
    fresh = conn.clone()
    got = [fresh.default_channel.basic_get("jobs").payload for _ in range(5)]
    assert got == [0, 1, 2, 3, 4]
    fresh.release()  # closing the channel hands its five back too
    again = conn.clone()
    assert again.default_channel.basic_get("jobs").payload == 0
    again.release()


def test_held_messages_are_renewed_and_come_back_once_the_holder_stops(conn, redis_url, options):
    publish(conn, "jobs", "held")
    holder = Connection(f"simplebroker+{redis_url}", transport_options=options)
    message = holder.default_channel.basic_get("jobs")
    assert message.payload == "held"
    survivor = conn.channel()
    # The holder's heartbeat renews the 2 s lease: recovery finds nothing to take.
    deadline = time.monotonic() + 3.5
    while time.monotonic() < deadline:
        survivor.connection.store.leases.recover()
        assert survivor.basic_get("jobs") is None
        time.sleep(0.2)
    holder.transport.store.heartbeat.stop()  # the holder "dies": renewals stop, nothing is released
    stopped = time.monotonic()
    while (got := survivor.basic_get("jobs")) is None:
        survivor.connection.store.leases.recover()  # what every worker's heartbeat does each second
        time.sleep(0.1)
        assert time.monotonic() - stopped < 15
    assert got.payload == "held" and got.delivery_info["redelivered"]
    got.ack()
    holder.release()


def test_an_idle_consumer_wakes_on_a_write_without_polling(conn, redis_url, options):
    received: list[float] = []
    queue = Queue("jobs", Exchange("jobs"), "jobs")

    def on_message(body: Any, message: Any) -> None:
        received.append(time.monotonic())
        message.ack()

    with Consumer(conn, [queue], callbacks=[on_message]):
        try:  # the first drain polls (empty) and subscribes
            conn.drain_events(timeout=0.3)
        except TimeoutError:
            pass
        sent: list[float] = []

        def send() -> None:
            time.sleep(0.5)
            with Connection(f"simplebroker+{redis_url}", transport_options=options) as other:
                sent.append(time.monotonic())
                publish(other, "jobs", "wake")

        thread = threading.Thread(target=send)
        thread.start()
        conn.drain_events(timeout=5)  # the default idle recheck is 10 s: only a wake-up helps
        thread.join()
    assert received and received[0] - sent[0] < 1.0


def test_purge_size_and_delete(conn, core):
    publish(conn, "jobs", *range(7))
    channel = conn.channel()
    held = channel.basic_get("jobs")
    assert channel.queue_declare("jobs", passive=True).message_count == 6  # ready ones only
    assert channel.queue_purge("jobs") == 6  # the held message is not "ready"
    assert channel.queue_declare("jobs", passive=True).message_count == 0
    assert len(core.peek_many("jobs", 10)) == 1  # SimpleBroker still shows the held one
    held.ack()
    publish(conn, "jobs", 1)
    channel.queue_delete("jobs")
    assert core.peek_many("jobs", 10) == []


def test_fanout_reaches_queues_bound_by_other_processes(conn, redis_url, options, core):
    exchange = Exchange("bcast", type="fanout")
    listeners = []
    for name in ("a@host.pidbox", "b@host.pidbox"):
        other = Connection(f"simplebroker+{redis_url}", transport_options=options)
        Queue(name, exchange, expires=5.0, auto_delete=True)(other.default_channel).declare()
        listeners.append(other)
    with Connection(f"simplebroker+{redis_url}", transport_options=options) as sender:
        Producer(sender.default_channel).publish(
            {"m": "ping"}, exchange=exchange, declare=[exchange], serializer="json"
        )
    for name in ("a@host.pidbox", "b@host.pidbox"):
        assert len(core.peek_many(storage_queue(name), 10)) == 1
    for other in listeners:
        other.release()


def test_broker_transport_setting_selects_the_transport_without_the_alias(redis_url, namespace):
    conn = Connection(
        redis_url,
        transport="celery_simplebroker.transport:Transport",
        transport_options={"namespace": namespace},
    )
    try:
        assert isinstance(conn.transport, Transport)
        publish(conn, "jobs", "x")
        assert conn.default_channel.basic_get("jobs").payload == "x"
    finally:
        conn.release()


def test_expired_messages_are_dropped_when_taken(conn, core):
    producer = Producer(conn.default_channel)
    producer.publish("stale", routing_key="jobs", expiration=0.2)
    producer.publish("fresh", routing_key="jobs")
    time.sleep(0.4)
    assert conn.default_channel.basic_get("jobs").payload == "fresh"
    assert core.peek_many("jobs", 10) != []  # "fresh" is held, "stale" is gone
    assert len(core.peek_many("jobs", 10)) == 1


def test_a_queue_found_empty_is_not_polled_again_until_its_wake_up(conn, redis_url, options):
    """Celery's pidbox queue, polled in turn with the task queue, costs no round trip per task."""
    got: list[Any] = []

    def on_message(body: Any, message: Any) -> None:
        got.append(body)
        if not message.acknowledged:
            message.ack()

    store = conn.transport.store
    claims = []
    claim = store.claim
    store.claim = lambda queue, ttl: claims.append(queue) or claim(queue, ttl)  # round trips
    mailbox = conn.channel()
    with (
        Consumer(conn.default_channel, [Queue("work")], callbacks=[on_message]),
        Consumer(mailbox, [Queue("mbox")], callbacks=[on_message], no_ack=True),
    ):
        with Connection(f"simplebroker+{redis_url}", transport_options=options) as other:
            publish(other, "work", *range(20))
            while len(got) < 20:
                conn.drain_events(timeout=5)
            assert len(claims) <= 2, claims  # not one per delivered task
            publish(other, "mbox", "ping")  # its wake-up makes the mailbox worth a poll again
            conn.drain_events(timeout=5)
    assert got[-1] == "ping"


def test_an_ack_racing_with_a_renewal_is_not_reported_as_an_expired_lease(conn, caplog):
    """The heartbeat's renewal may run just after the server settled a token's last message."""
    publish(conn, "jobs", "x")
    channel = conn.channel()
    message = channel.basic_get("jobs")
    store = conn.transport.store
    heartbeat = store.heartbeat
    heartbeat.stop()  # this test runs the renewal itself, at the worst moment
    leases = store.leases
    ack = leases.ack

    def ack_then_renew(*args: Any, **kwargs: Any) -> Any:
        settled = ack(*args, **kwargs)  # the server dropped the token
        heartbeat._renew(leases)  # the heartbeat thread's turn, before ack() returns
        return settled

    leases.ack = ack_then_renew
    message.ack()
    assert "ran out before this process could renew" not in caplog.text


@pytest.mark.parametrize(
    "target",
    [
        "redis://:s3cret@127.0.0.1:6379/0",
        "redis+cluster://app:s3cret@10.0.0.1:7000,10.0.0.2:7000",
        "rediss+sentinel://app:s3cret@10.0.0.1:26379,10.0.0.2:26379/mymaster/0",
    ],
)
def test_urls_shown_in_celerys_banner_hide_the_password_for_every_target_form(target):
    from celery import Celery

    app = Celery("banner", broker=f"simplebroker+{target}", backend=f"simplebroker+{target}")
    try:
        shown = [app.connection_for_write().as_uri(), app.backend.as_uri()]
        hosts = target.split("@", 1)[1]
        for url in shown:
            assert "s3cret" not in url
            assert url.startswith("simplebroker+") and url.endswith(hosts), url
        assert app.backend.as_uri(include_password=True) == f"simplebroker+{target}"
    finally:
        app.close()


def test_a_cancelled_consumer_drops_its_wake_up_subscription(conn, redis_url, namespace):
    """A connection that stopped consuming (``celery inspect``'s replies) subscribes to nothing."""
    from simplebroker_redis.activity import existing_listener

    queue = Queue("replies", Exchange("replies"), "replies")
    runner = RedisRunner(redis_url, namespace=namespace)
    channel = runner.keys.wake_channel(storage_queue("replies"))
    try:
        with Consumer(conn, [queue], callbacks=[lambda body, message: message.ack()]):
            with pytest.raises(TimeoutError):
                conn.drain_events(timeout=0.3)  # polls (empty) and subscribes
            listener = existing_listener(runner)
            assert listener is not None and channel in listener._callbacks
        assert channel not in listener._callbacks  # cancelled: unsubscribed, connection open
    finally:
        runner.shutdown()


def test_an_unconfirmed_publish_is_written_once_and_not_retried(redis_url, options, conn, core):
    """``wait_replicas`` unmet: kombu's retry (Celery's default) must not send it twice."""
    from celery_simplebroker import UnconfirmedPublish
    from simplebroker_redis import ReplicationTimeout

    durable = {**options, "wait_replicas": 5, "wait_timeout": 0.05}  # more than any topology
    fanout = Exchange("all", type="fanout")
    for name in ("a", "b"):  # bound without durability options (a binding is a write too)
        Queue(name, fanout)(conn.default_channel).declare()
    with Connection(f"simplebroker+{redis_url}", transport_options=durable) as unconfirmed:
        producer = Producer(unconfirmed.default_channel)
        with pytest.raises(
            UnconfirmedPublish, match="happened.*of 5 replicas.*not sent again"
        ) as e:
            producer.publish({"n": 1}, routing_key="durable", retry=True)
        assert isinstance(e.value.__cause__, ReplicationTimeout)
        broadcaster = Producer(unconfirmed.default_channel, exchange=fanout)  # declares it here
        with pytest.raises(UnconfirmedPublish):
            broadcaster.publish({"n": 2}, retry=True)  # one broadcast script
    assert len(core.peek_many(storage_queue("durable"), 10)) == 1  # written once, not confirmed
    assert [len(core.peek_many(storage_queue(q), 10)) for q in ("a", "b")] == [1, 1]
    from celery import Celery  # and through Celery, whose send_task retries by default

    app = Celery("unconfirmed", broker=f"simplebroker+{redis_url}")
    app.conf.broker_transport_options = durable
    try:
        with pytest.raises(UnconfirmedPublish):
            # The default exchange and no declaration: binding a queue is a write as well.
            app.send_task("add", (1, 2), exchange="", routing_key="celery", declare=[])
    finally:
        app.close()
    assert len(core.peek_many(storage_queue("celery"), 10)) == 1


def test_an_unconfirmed_ack_or_reject_is_a_warning_not_an_error(
    redis_url, options, conn, core, caplog
):
    """It happened: Celery must not log a failed acknowledgement (critical) for it."""
    from simplebroker_redis import Leases

    publish(conn, "acked", {"n": 1})
    lease = Leases(core.runner).reserve(storage_queue("acked"), 1, 30.0)
    publish(conn, "acked", {"n": 2})
    rejected = Leases(core.runner).reserve(storage_queue("acked"), 1, 30.0)
    durable = {
        **options,
        "wait_replicas": 5,
        "wait_timeout": 0.05,
        "dead_letter_queue": "acked.dead",
    }
    with Connection(f"simplebroker+{redis_url}", transport_options=durable) as unconfirmed:
        unconfirmed.connect()
        unconfirmed.transport.store.ack(lease.token, lease.ids[0])  # no error
        store = unconfirmed.transport.store
        store.dead_letter(rejected.token, rejected.ids[0])  # reject(requeue=False)
    assert core.peek_many(storage_queue("acked"), 10) == []
    assert [i for _, i in core.peek_many(storage_queue("acked.dead"), 10)] == list(rejected.ids)
    assert f"message {lease.ids[0]} acknowledged, not confirmed" in caplog.text
    assert f"message {rejected.ids[0]} moved to" in caplog.text
    assert "after its lease expired" not in caplog.text


def test_an_unreplicated_reservation_is_handed_back_uncounted(redis_url, options, conn, core):
    """A reservation that raised ``ReplicationTimeout`` goes back at once, its delivery not counted.

    Stranded until its lease expired, each try would count a delivery, and
    with ``max_deliveries`` send the oldest messages to the dead-letter queue
    without running.
    """
    from simplebroker_redis import Leases, ReplicationTimeout

    publish(conn, "durable", {"n": 1})
    [(_, message_id)] = core.peek_many(storage_queue("durable"), 10)
    durable = {**options, "wait_replicas": 5, "wait_timeout": 0.05}
    with Connection(f"simplebroker+{redis_url}", transport_options=durable) as unconfirmed:
        for _ in range(3):
            with pytest.raises(ReplicationTimeout, match="happened.*0 of 5 replicas"):
                unconfirmed.default_channel.basic_get("durable")
    assert Leases(core.runner).deliveries(message_id) == 0
    assert core.peek_many(storage_queue("durable"), 10) == [(ANY, message_id)]
    message = conn.default_channel.basic_get("durable")  # still there, first delivery
    assert message is not None and message.payload == {"n": 1}
    message.ack()


def test_priorities_are_separate_queues_read_highest_first(conn, core):
    """Celery's ``priority`` (0-9, 9 first): ``<queue>.p<P>`` queues, FIFO within one."""
    producer = Producer(conn.default_channel)
    for body, priority in [("a", 0), ("b", 0), ("urgent", 9), ("c", 0), ("mid", 5), ("mid2", 5)]:
        producer.publish(body, routing_key="jobs", serializer="json", priority=priority)
    stored = {name: len(core.peek_many(name, 10)) for name in ("jobs.p9", "jobs.p5", "jobs")}
    assert stored == {"jobs.p9": 1, "jobs.p5": 2, "jobs": 3}  # broker peek shows each priority
    channel = conn.default_channel
    assert channel.queue_declare("jobs", passive=True).message_count == 6
    taken = []
    while (message := channel.basic_get("jobs")) is not None:
        taken.append(message.payload)
        message.ack()
    assert taken == ["urgent", "mid", "mid2", "a", "b", "c"]


def test_priorities_off_keeps_one_queue_in_write_order(redis_url, options, core):
    with Connection(
        f"simplebroker+{redis_url}", transport_options={**options, "priorities": False}
    ) as conn:
        producer = Producer(conn.default_channel)
        for body, priority in [("a", 0), ("urgent", 9), ("b", 3)]:
            producer.publish(body, routing_key="jobs", serializer="json", priority=priority)
        assert core.peek_many("jobs.p9", 10) == []
        taken = []
        while (message := conn.default_channel.basic_get("jobs")) is not None:
            taken.append(message.payload)
            message.ack()
    assert taken == ["a", "urgent", "b"]


def test_purge_removes_every_priority(conn, core):
    producer = Producer(conn.default_channel)
    for priority in (0, 4, 9):
        producer.publish("x", routing_key="jobs", serializer="json", priority=priority)
    assert conn.default_channel.queue_purge("jobs") == 3
    assert [core.peek_many(name, 10) for name in ("jobs", "jobs.p4", "jobs.p9")] == [[], [], []]


@pytest.mark.parametrize("priority", [9, 0])
def test_an_idle_consumer_wakes_for_a_message_of_any_priority(conn, redis_url, options, priority):
    received: list[Any] = []
    queue = Queue("jobs", Exchange("jobs"), "jobs")

    def on_message(body: Any, message: Any) -> None:
        received.append(body)
        message.ack()

    with Consumer(conn, [queue], callbacks=[on_message]):
        with pytest.raises(TimeoutError):
            conn.drain_events(timeout=0.3)  # polls (empty) and subscribes to every priority
        sent: list[float] = []

        def send() -> None:
            with Connection(f"simplebroker+{redis_url}", transport_options=options) as other:
                sent.append(time.monotonic())
                Producer(other.default_channel).publish(
                    "wake", routing_key="jobs", serializer="json", priority=priority
                )

        thread = threading.Thread(target=send)
        thread.start()
        conn.drain_events(timeout=5)  # the idle recheck is 10 s: only a wake-up helps
        woken = time.monotonic()
        thread.join()
    assert received == ["wake"] and woken - sent[0] < 1.0


def test_an_invalid_priorities_option_is_refused(redis_url, options):
    from celery_simplebroker.options import ConfigurationError

    with pytest.raises(ConfigurationError, match="priorities"):
        Connection(
            f"simplebroker+{redis_url}", transport_options={**options, "priorities": "yes"}
        ).connect()


def test_a_queue_with_a_backlog_is_not_listened_to_until_it_runs_dry(redis_url, options, raw):
    """A backlog's writes do not wake the consumer's process; an idle queue wakes it again."""
    from celery_simplebroker.poller import MUTE_AFTER

    options = {**options, "reserve_batch": 1}
    runner = RedisRunner(redis_url, namespace=options["namespace"])
    channel = runner.keys.wake_channel(storage_queue("jobs"))
    runner.shutdown()

    def listeners() -> int:
        return int(raw.execute_command("PUBSUB", "SHARDNUMSUB", channel)[1])

    got: list[Any] = []
    with Connection(f"simplebroker+{redis_url}", transport_options=options) as conn:
        with Connection(f"simplebroker+{redis_url}", transport_options=options) as other:
            publish(other, "jobs", *range(MUTE_AFTER + 10))
            queue = Queue("jobs", Exchange("jobs"), "jobs")

            def on_message(body: Any, message: Any) -> None:
                got.append(body)
                message.ack()

            with Consumer(conn, [queue], callbacks=[on_message]):
                conn.drain_events(timeout=5)
                assert listeners() == 1  # subscribed before the first poll
                while len(got) < MUTE_AFTER + 1:
                    conn.drain_events(timeout=5)
                assert listeners() == 0  # a backlog: every write would wake us for nothing
                while len(got) < MUTE_AFTER + 10:
                    conn.drain_events(timeout=5)
                # Running dry, the consumer listens again before it sleeps: a
                # write during its first sleep wakes it (no acknowledgement's
                # nudge pending to end that sleep early).
                conn.transport.poller.wakeups.wait(0, wakeups=False)
                sent: list[float] = []

                def send() -> None:
                    time.sleep(0.5)
                    sent.append(time.monotonic())
                    publish(other, "jobs", "wake")

                thread = threading.Thread(target=send)
                thread.start()
                conn.drain_events(timeout=5)  # the idle recheck is 10 s: only a wake-up helps
                woke = time.monotonic()
                thread.join()
                assert listeners() == 1
    assert got == [*range(MUTE_AFTER + 10), "wake"]
    assert woke - sent[0] < 1.0


def test_unknown_transport_options_are_named_once_in_a_warning(
    redis_url, options, caplog, monkeypatch
):
    """A typo, or a Redis-transport option with no meaning here, is logged and ignored."""
    from celery_simplebroker import options as options_module

    monkeypatch.setattr(options_module, "_warned", set())
    given = {
        **options,
        "lease_second": 5,  # a typo
        "visibility_timeout": 3600,  # Celery's Redis transport
        "max_retries": 3,  # kombu's own retry policy: known
        "dead_letter_queue": "dead",  # ours: known
    }
    caplog.set_level("WARNING", logger="celery_simplebroker")
    for _ in range(2):  # once per process, not per connection
        with Connection(f"simplebroker+{redis_url}", transport_options=given) as conn:
            conn.connect()
            assert conn.transport.options.lease_seconds == options["lease_seconds"]
    warnings = [r.getMessage() for r in caplog.records if r.name == "celery_simplebroker"]
    assert warnings == [
        "broker_transport_options: 'lease_second' is not an option of celery_simplebroker"
        " (ignored); did you mean 'lease_seconds'?",
        "broker_transport_options: 'visibility_timeout' is ignored: there is no visibility"
        " timeout: a worker's messages are held under a lease ('lease_seconds') renewed while"
        " it lives",
    ]


def test_a_worker_shutdown_ends_an_idle_drain_at_once(conn, redis_url, options, core):
    """Celery's SIGTERM handler (in the main thread, on top of the sleep) ends it.

    Celery's loop for a transport like this drains with a 2 s timeout,
    checks for a shutdown between drains and drains once more on its way
    out; before, a SIGTERM waited for the sleeps (here up to the 10 s idle
    recheck) to end. Later drains deliver nothing and return within a nap.
    """
    import signal

    from celery import signals

    from celery_simplebroker.poller import STOPPING_NAP

    def on_alarm(signum: int, frame: Any) -> None:  # what Celery's _shutdown_handler sends
        signals.worker_shutting_down.send(sender="w", sig="SIGTERM", how="Warm", exitcode=0)

    received: list[Any] = []

    def on_message(body: Any, message: Any) -> None:
        received.append(body)
        message.ack()

    with Consumer(conn, [Queue("idle", Exchange("idle"), "idle")], callbacks=[on_message]):
        previous = signal.signal(signal.SIGALRM, on_alarm)
        try:
            signal.setitimer(signal.ITIMER_REAL, 0.5)
            started = time.monotonic()
            with pytest.raises(TimeoutError):
                conn.drain_events(timeout=30)
            assert 0.4 < time.monotonic() - started < 3.0
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        with Connection(f"simplebroker+{redis_url}", transport_options=options) as other:
            publish(other, "idle", "late")
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            conn.drain_events(timeout=30)
        assert time.monotonic() - started < STOPPING_NAP + 1.0
    assert received == []
    assert core.get_queue_stat("idle").pending == 1  # neither taken nor lost


@pytest.mark.parametrize("how", ["cancel", "close"])
def test_an_auto_delete_queue_goes_with_its_last_consumer(redis_url, options, core, how):
    """Celery's event and mailbox queues (auto_delete) do not outlive a stopped worker.

    Celery stops a consumer step by cancelling its consumers, then closing
    their channel; a closed channel cancels what is left.
    """
    events = Exchange("ev", type="topic")
    temporary = Queue("ev.tmp", events, "#", auto_delete=True)
    kept = Queue("ev.kept", events, "#")
    with Connection(f"simplebroker+{redis_url}", transport_options=options) as conn:
        channel = conn.channel()
        consumers = [Consumer(channel, [queue], callbacks=[]) for queue in (temporary, kept)]
        for consumer in consumers:
            consumer.consume()
        with Connection(f"simplebroker+{redis_url}", transport_options=options) as other:
            Producer(other.default_channel, exchange=events).publish({"e": 1}, routing_key="a.b")
            assert {q for _, _, q in other.default_channel.get_table("ev")} == {"ev.tmp", "ev.kept"}
        assert core.get_queue_stat("ev.tmp").total == 1
        if how == "cancel":
            consumers[0].cancel()
        channel.close()
        table = {q for _, _, q in conn.default_channel.get_table("ev")}
    assert table == {"ev.kept"}  # unbound: later events go nowhere
    assert core.get_queue_stat("ev.tmp").total == 0
    assert core.get_queue_stat("ev.kept").total == 1


def test_in_an_event_loop_messages_arrive_by_the_alarm_not_by_polling(conn, redis_url, options):
    """Celery's hub runs the transport: a backlog is delivered in a few turns, then the
    loop's poll sleeps until a write's wake-up rings the alarm (not the 10 s recheck);
    acknowledgements made in the loop open the prefetch window again; a closed
    connection leaves the loop."""
    from kombu.asynchronous import Hub

    hub = Hub()
    received: list[Any] = []

    def on_message(body: Any, message: Any) -> None:
        received.append(body)
        message.ack()

    publish(conn, "looped", *range(7))
    with Connection(f"simplebroker+{redis_url}", transport_options=options) as worker:
        channel = worker.channel()
        channel.basic_qos(0, 2, False)  # a prefetch window of 2: the 7 need acks to get through
        consumer = Consumer(channel, [Queue("looped", Exchange("looped"), "looped")])
        consumer.register_callback(on_message)
        consumer.consume()
        transport = worker.transport
        transport.register_with_event_loop(worker.connection, hub)
        loop = hub.create_loop()
        for _ in range(40):
            if len(received) == 7:
                break
            next(loop)
        assert received == list(range(7))

        threading.Timer(0.5, publish, (conn, "looped", "late")).start()
        started = time.monotonic()
        while len(received) < 8 and time.monotonic() - started < 8:
            next(loop)
        assert received[7:] == ["late"]
        assert time.monotonic() - started < 3.0  # the idle recheck is 10 s away
        assert channel.qos.can_consume_max_estimate() == 2  # all acknowledged: the window is open
        consumer.cancel()
    assert transport.poller._on_tick not in hub.on_tick
    assert not hub.readers
    hub.close()
