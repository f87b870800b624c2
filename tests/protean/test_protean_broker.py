"""The provider's delivery contract, on Redis and on SQLite alike.

Every group gets every message of a stream, in publish order, including
messages published before the group existed; the consumers of one group
share them; acks, nacks and dead letters behave the same on both backends.
Each broker instance made by ``make_broker`` is a consumer of its own.
"""

from __future__ import annotations

import threading
from collections import Counter

import pytest
from protean.port.broker import BrokerCapabilities
from simplebroker.ext import MessageError, QueueNameError

from protean_simplebroker.groups import copy_ids
from protean_simplebroker.names import Layout

STREAM = "shop::order"


def publish(broker, count, stream=STREAM, start=0):
    return [broker.publish(stream, {"n": i}) for i in range(start, start + count)]


def drain(broker, group, stream=STREAM, ack=True):
    got = []
    while taken := broker.read(stream, group, 10):
        for identifier, payload in taken:
            got.append((identifier, payload))
            if ack:
                assert broker.ack(stream, identifier, group) is True
    return got


def test_capabilities_are_ordered_blocking_and_dead_letters(broker):
    assert broker.has_all_capabilities(
        BrokerCapabilities.ORDERED_MESSAGING
        | BrokerCapabilities.BLOCKING_READ
        | BrokerCapabilities.DEAD_LETTER_QUEUE
    )
    assert not broker.has_capability(BrokerCapabilities.STREAM_PARTITIONING)


def test_every_group_gets_every_message_in_order_also_a_late_one(make_broker):
    publisher, early, late = make_broker(), make_broker(), make_broker()
    early._ensure_group("early", STREAM)
    ids = publish(publisher, 25)
    got_early = drain(early, "early")
    # A group created after the messages were published still gets all of them.
    got_late = drain(late, "late")
    for got in (got_early, got_late):
        assert [identifier for identifier, _ in got] == ids
        assert [payload["n"] for _, payload in got] == list(range(25))
    assert drain(early, "early") == drain(late, "late") == []


def test_consumers_of_a_group_share_its_messages(make_broker):
    publisher = make_broker()
    consumers = [make_broker() for _ in range(3)]
    ids = publish(publisher, 60)
    seen: list[str] = []
    lock = threading.Lock()

    def consume(broker):
        while taken := broker.read(STREAM, "shared", 4):
            for identifier, _ in taken:
                with lock:
                    seen.append(identifier)
                assert broker.ack(STREAM, identifier, "shared")

    threads = [threading.Thread(target=consume, args=(c,)) for c in consumers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(seen) == sorted(ids)
    assert not [i for i, n in Counter(seen).items() if n > 1]


def test_a_held_message_goes_to_nobody_else_while_its_consumer_lives(make_broker):
    one, two = make_broker(), make_broker()
    [identifier] = publish(one, 1)
    assert one.get_next(STREAM, "g")[0] == identifier
    assert two.get_next(STREAM, "g") is None
    assert two.nack(STREAM, identifier, "g") is False  # not two's to hand back
    # A nack keeps it for its consumer's next read (a Redis Streams pending entry).
    assert one.nack(STREAM, identifier, "g") is True
    assert two.get_next(STREAM, "g") is None
    assert one.get_next(STREAM, "g")[0] == identifier
    # A consumer that closes hands back what it holds, at once.
    one.close()
    assert two.get_next(STREAM, "g")[0] == identifier
    assert two.ack(STREAM, identifier, "g") is True
    assert two.get_next(STREAM, "g") is None


def test_a_nacked_message_comes_back_first(broker):
    ids = publish(broker, 3)
    first = broker.read(STREAM, "g", 2)
    assert [i for i, _ in first] == ids[:2]
    assert broker.nack(STREAM, ids[1], "g")
    assert broker.nack(STREAM, ids[0], "g")
    assert [i for i, _ in broker.read(STREAM, "g", 3)] == ids


def test_ack_after_nack_consumes_and_a_second_ack_is_refused(broker):
    [identifier] = publish(broker, 1)
    broker.get_next(STREAM, "g")
    assert broker.nack(STREAM, identifier, "g")
    assert broker.ack(STREAM, identifier, "g") is True
    assert broker.ack(STREAM, identifier, "g") is False
    assert broker.get_next(STREAM, "g") is None


def test_groups_and_streams_are_isolated(broker):
    [a] = publish(broker, 1, stream="a:stream")
    [b] = publish(broker, 1, stream="b.stream")
    assert broker.get_next("a:stream", "g")[0] == a
    assert broker.ack("b.stream", a, "g") is False
    assert broker.ack("a:stream", a, "other") is False
    assert broker.get_next("b.stream", "g")[0] == b


def test_past_max_deliveries_a_nacked_message_is_dead_lettered(make_broker):
    broker = make_broker(MAX_DELIVERIES=2)
    [identifier, other] = publish(broker, 2)
    for _ in range(2):
        taken = broker.get_next(STREAM, "g")
        assert taken[0] == identifier
        assert broker.nack(STREAM, identifier, "g")
    assert broker.get_next(STREAM, "g")[0] == other  # the dead one is gone
    [entry] = broker.dlq_list([f"{STREAM}:dlq"])
    assert (entry.original_id, entry.consumer_group, entry.payload) == (identifier, "g", {"n": 0})
    assert entry.failure_reason == "max_retries_exceeded"
    assert entry.retry_count >= 2
    assert broker.dlq_depth(f"{STREAM}:dlq") == 1
    # The other group still has both messages.
    assert [i for i, _ in drain(broker, "g2")] == [identifier, other]


def test_subscription_nacks_do_not_count_toward_max_deliveries(make_broker):
    broker = make_broker(MAX_DELIVERIES=1)
    broker._mark_subscription_owned(STREAM, "g")
    [identifier] = publish(broker, 1)
    for _ in range(4):
        assert broker.get_next(STREAM, "g")[0] == identifier
        assert broker.nack(STREAM, identifier, "g")
    assert broker.dlq_depth(f"{STREAM}:dlq") == 0


def test_dead_letters_replay_to_their_group_and_purge(make_broker):
    broker = make_broker(MAX_DELIVERIES=1)
    ids = publish(broker, 3)
    for identifier in ids:
        broker.get_next(STREAM, "g")
        broker.nack(STREAM, identifier, "g")
    dlq = f"{STREAM}:dlq"
    assert {e.original_id for e in broker.dlq_list([dlq])} == set(ids)
    assert broker.dlq_inspect(dlq, ids[0]).payload == {"n": 0}
    assert broker.dlq_replay(dlq, ids[0], STREAM) is True
    assert broker.dlq_inspect(dlq, ids[0]) is None
    # Back in its group only, under its identifier, with a fresh delivery count.
    assert broker.get_next(STREAM, "g") == (ids[0], {"n": 0})
    assert broker.ack(STREAM, ids[0], "g")
    assert broker.get_next(STREAM, "other") == (ids[0], {"n": 0})
    assert broker.dlq_purge(dlq) == 2
    assert broker.dlq_list([dlq]) == []


def test_protean_dead_letters_are_listed_replayed_and_trimmed(broker):
    dlq = f"{STREAM}:dlq"
    meta = {"original_stream": STREAM, "original_id": "7", "consumer_group": "g", "retry_count": 3}
    entry_id = broker.publish(dlq, {"n": 1, "_dlq_metadata": meta})
    [entry] = broker.dlq_list([dlq])
    assert (entry.dlq_id, entry.original_id, entry.consumer_group) == (entry_id, "7", "g")
    assert broker.dlq_replay(dlq, entry_id, STREAM) is True
    assert broker.get_next(STREAM, "g")[1] == {"n": 1}  # republished without the metadata
    broker.publish(dlq, {"n": 2, "_dlq_metadata": meta})
    assert broker.dlq_trim(dlq, "1-0") == 0  # older than 1970: nothing
    assert broker.dlq_trim(dlq, "99999999999999-0") == 1
    assert broker.dlq_depth(dlq) == 0


def test_trim_never_drops_what_a_group_has_not_copied(make_broker):
    publisher, consumer = make_broker(), make_broker()
    consumer._ensure_group("slow", STREAM)
    ids = publish(publisher, 10)
    assert publisher.trim(STREAM, 2) == 0  # "slow" has copied nothing yet
    first = consumer.read(STREAM, "slow", 6)  # copies every entry (one batch)
    for identifier, _ in first:
        assert consumer.ack(STREAM, identifier, "slow")
    assert publisher.trim(STREAM, 2) == 8
    rest = drain(consumer, "slow")
    assert [i for i, _ in first + rest] == ids  # the group lost nothing


def test_info_and_health_report_groups_backlogs_and_held_messages(make_broker):
    publisher, consumer = make_broker(), make_broker()
    publish(publisher, 3)
    publish(publisher, 2, stream="other")
    consumer.get_next(STREAM, "g1")
    info = publisher.info()["consumer_groups"]
    assert set(info) == {"g1"}
    assert info["g1"]["pending"] == 3  # one held, two copied or not yet
    assert info["g1"]["created_at"] == publisher.info()["consumer_groups"]["g1"]["created_at"]
    details = publisher.health_stats()["details"]
    assert details["message_counts"]["total_messages"] == 5
    assert details["message_counts"]["in_flight"] == 1
    assert details["streams"]["names"] == sorted([STREAM, "other"])
    assert details["consumer_groups"]["names"] == ["g1"]
    assert details["memory_estimate_bytes"] > 0


def test_data_reset_removes_only_this_prefix(make_broker):
    ours, theirs = make_broker(), make_broker(QUEUE_PREFIX="other")
    publish(ours, 2)
    publish(theirs, 1)
    ours.get_next(STREAM, "g")
    ours._data_reset()
    assert ours.info()["consumer_groups"] == {}
    assert ours.get_next(STREAM, "g") is None
    assert theirs.get_next(STREAM, "g")[1] == {"n": 0}


def test_queue_names_map_streams_and_groups(broker):
    layout = Layout("protean")
    [identifier] = publish(broker, 1)
    broker.get_next(STREAM, "app.Mailer")
    names = set(broker.store.conn.list_queues(prefix="protean."))
    assert layout.log(STREAM) == "protean.shop-3a-3aorder"
    assert {layout.log(STREAM), layout.at(STREAM, "app.Mailer")} <= names
    parsed = {layout.parse(name) for name in names}
    assert all(p is not None and p.stream == STREAM for p in parsed)
    body = broker.store.peek(layout.log(STREAM), 1)[0]
    assert body == ('{"n": 0}', int(identifier))  # the log holds the message as published


def test_oversized_message_is_refused_before_anything_is_written(broker):
    room = broker.store.max_message_size
    with pytest.raises(MessageError, match="exceeds"):
        broker.publish(STREAM, {"blob": "x" * room})
    assert broker.store.conn.list_queues(prefix="protean.") == []


def test_copy_ids_take_the_upper_half_of_the_next_grains():
    after = (12345 << 12) | 7
    ids = copy_ids(after, 2050)
    assert ids == sorted(set(ids)) and ids[0] > after
    assert all(i & 0xFFF >= 2048 for i in ids)
    assert {i >> 12 for i in ids} == {12346, 12347}


def test_a_copy_whose_ids_are_taken_is_retried_past_them(broker):
    broker._ensure_group("g", STREAM)
    ids = publish(broker, 3)
    group = broker.groups.ensure(STREAM, "g")
    taken = copy_ids(group.lock_id, 4)[1]  # what the first copy would use
    broker.store.conn.insert_messages([("protean.squatter", "x", taken)])
    assert [i for i, _ in drain(broker, "g")] == ids
    assert broker.store.peek("protean.squatter", 5) == [("x", taken)]


@pytest.mark.parametrize(
    ("stream", "message", "error"),
    [
        ("", {"n": 1}, ValueError),
        ("s" * 600, {"n": 1}, QueueNameError),  # too long for a queue name
        (STREAM, {"n": object()}, TypeError),  # not JSON
    ],
)
def test_bad_publishes_are_refused_before_anything_is_written(broker, stream, message, error):
    with pytest.raises(error):
        broker.publish(stream, message)
    assert broker.store.conn.list_queues(prefix="protean.") == []


def test_bad_group_names_and_timeouts_are_refused(broker):
    with pytest.raises(ValueError):
        broker._ensure_group("", STREAM)
    with pytest.raises(ValueError):
        broker._ensure_group("g", None)
    with pytest.raises(ValueError, match="waits >= 0 ms"):
        broker.read_blocking(STREAM, "g", "c", timeout_ms=-1)
    assert broker.store.conn.list_queues(prefix="protean.") == []
