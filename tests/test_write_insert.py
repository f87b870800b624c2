"""Writes: validation, body round trips, exact-ID inserts and the keep_newest window."""

from __future__ import annotations

import pytest
from simplebroker.ext import IntegrityError, MessageError, QueueNameError

from simplebroker_redis import Leases, ReservationConflict
from simplebroker_redis.keys import Keyspace
from support.state import body_map, members, stored, without_meta


def _assert_untouched(sb, high_water: int = 0) -> None:
    assert sb.list_queues() == []
    assert sb.refresh_last_timestamp() == high_water
    assert sb.status()["total_messages"] == 0


@pytest.mark.parametrize(
    "body",
    [
        "",
        "plain",
        "nul\x00byte\x00",
        "ünïcødé ✓ 🎉 漢字",
        "line1\nline2\r\n\ttab",
        "  padded  ",
        "%s %d {} \\ ' \" [] * ?",
        "x" * 100_000,
        "-- looks like lua ]] [[ end",
    ],
    ids=["empty", "plain", "nul", "unicode", "newlines", "spaces", "format", "100k", "lua"],
)
def test_bodies_round_trip_exactly(sb, body):
    written = sb.write("q", body)
    assert sb.peek_one("q", exact_timestamp=written) == (body, written)
    assert sb.claim_one("q") == (body, written)
    assert sb.peek_one("q", include_claimed=True) == (body, written)


@pytest.mark.parametrize(
    ("queue", "message", "keep", "error"),
    [
        ("", "x", None, QueueNameError),
        ("-q", "x", None, QueueNameError),
        (".q", "x", None, QueueNameError),
        ("q q", "x", None, QueueNameError),
        ("q/x", "x", None, QueueNameError),
        ("é", "x", None, QueueNameError),
        ("@alias", "x", None, QueueNameError),
        ("a" * 513, "x", None, QueueNameError),
        ("q", 5, None, MessageError),
        ("q", b"bytes", None, MessageError),
        ("q", None, None, MessageError),
        ("q", "lone \ud800 surrogate", None, MessageError),
        ("", 5, None, QueueNameError),  # the queue name is checked first
        ("q", "x", 0, ValueError),
        ("q", "x", 10_000, ValueError),
        ("q", "x", True, TypeError),
        ("q", "x", 2.0, TypeError),
        ("q", "x", "3", TypeError),
        ("", 5, True, TypeError),  # keep_newest is checked before anything else
    ],
)
def test_write_validation_rejects_before_any_change(sb, queue, message, keep, error):
    with pytest.raises(error):
        sb.write(queue, message, keep_newest=keep)
    _assert_untouched(sb)


@pytest.mark.parametrize("queue", ["a" * 512, "_private", "0starts-with.digit", "A.b-c_D"])
def test_every_valid_queue_name_round_trips(sb, queue):
    written = sb.write(queue, "x")
    assert sb.list_queues() == [queue]
    assert sb.claim_one(queue) == ("x", written)


def test_max_message_size_counts_utf8_bytes(open_core):
    small = open_core(MAX_MESSAGE_SIZE=8)
    assert small.write("q", "12345678") > 0
    assert small.write("q", "éééé") > 0  # 8 bytes
    for too_big in ("123456789", "ééééé"):  # 9 and 10 bytes
        with pytest.raises(MessageError):
            small.write("q", too_big)
        with pytest.raises(MessageError):
            small.broadcast(too_big)
        with pytest.raises(MessageError):
            small.insert_messages([("q", too_big, 5)])
    assert small.peek_many("q", with_timestamps=False) == ["12345678", "éééé"]


# -- insert_messages -----------------------------------------------------------------


def test_insert_keeps_exact_ids_and_raises_the_high_water(sb, open_core):
    base = sb.generate_timestamp() + 10**9
    sb.insert_messages([("a", "x", base + 4), ("b", "y", f"{base + 9:019d}"), ("a", "z", base)])
    assert sb.peek_many("a") == [("z", base), ("x", base + 4)]
    assert sb.peek_many("b") == [("y", base + 9)]
    assert open_core().refresh_last_timestamp() == base + 10
    assert sb.write("a", "next") > base + 10


def test_insert_below_the_high_water_keeps_it(sb):
    written = sb.write("q", "newer")
    sb.insert_messages([("q", "older", 5)])
    assert sb.refresh_last_timestamp() == written
    assert sb.peek_many("q") == [("older", 5), ("newer", written)]


def test_insert_accepts_an_allocated_id_without_a_row(sb):
    stamp = sb.generate_timestamp()
    sb.insert_messages([("q", "x", stamp)])
    assert sb.claim_one("q") == ("x", stamp)
    assert sb.refresh_last_timestamp() == stamp + 1


def test_insert_of_nothing_is_a_no_op(sb):
    sb.insert_messages([])
    sb.insert_messages(iter(()))
    _assert_untouched(sb)


@pytest.mark.parametrize("state", ["pending", "claimed"])
def test_insert_conflicting_id_inserts_nothing(sb, state):
    taken = sb.write("q", "original")
    if state == "claimed":
        sb.claim_one("q")
    fresh = taken + 10**9
    with pytest.raises(IntegrityError):
        sb.insert_messages([("new", "first", fresh), ("other", "dup", taken)])
    assert sb.list_queues() == ["q"]
    assert sb.peek_many("q", include_claimed=True) == [("original", taken)]
    assert sb.refresh_last_timestamp() == taken


@pytest.mark.parametrize(
    ("bad_record", "error"),
    [
        (("q", "zero", 0), ValueError),
        (("q", "zero", "0" * 19), ValueError),
        (("q", "dup", 300), IntegrityError),  # duplicates the first record
        (("q", "dup", "0000000000000000300"), IntegrityError),
        (("q", "short", "300"), ValueError),
        (("q", "bool", True), TypeError),
        (("q", "float", 3.0), TypeError),
        (("q", "negative", -1), ValueError),
        (("q", "ceiling", 2**63 - 1), ValueError),  # no room above for the high-water
        (("q", "over", 2**63), ValueError),
        (("-bad", "x", 400), QueueNameError),
        (("q", 5, 400), MessageError),
        (("q", "two fields"), TypeError),
    ],
)
def test_insert_validates_the_whole_batch_before_mutation(sb, bad_record, error):
    with pytest.raises(error):
        sb.insert_messages([("q", "valid", 300), bad_record])
    _assert_untouched(sb)


def test_insert_at_the_highest_insertable_id(sb):
    sb.insert_messages([("q", "top", 2**63 - 2)])
    assert sb.refresh_last_timestamp() == 2**63 - 1
    assert sb.peek_one("q") == ("top", 2**63 - 2)


def test_insert_stores_pending_rows_and_high_water(broker, raw, namespace):
    broker.insert_messages([("b", "y", 20), ("a", "x", 10), ("a", "w", 30)])
    state = stored(raw, namespace)
    assert state["meta"]["last_ts"] == f"{31:019d}"
    assert without_meta(state) == {
        "queues": ["a", "b"],
        "pending": members("a", 10, 30) + members("b", 20),
        "bodies": body_map({10: "x", 20: "y", 30: "w"}),
    }


# -- keep_newest --------------------------------------------------------------------


@pytest.mark.parametrize(("keep", "pending"), [(1, 1), (3, 3), (6, 6), (50, 6)])
def test_keep_newest_leaves_the_newest_n_pending(sb, keep, pending):
    old = [sb.write("q", f"m{i}") for i in range(5)]
    other = sb.write("other", "untouched")
    new = sb.write("q", "new", keep_newest=keep)
    every = [*old, new]
    assert [ts for _, ts in sb.peek_many("q")] == every[-pending:]
    stat = sb.get_queue_stat("q")
    assert (stat.pending, stat.claimed, stat.total) == (pending, 6 - pending, 6)
    assert [ts for _, ts in sb.peek_many("q", include_claimed=True)] == every
    assert sb.peek_many("other") == [("untouched", other)]


def test_keep_newest_counts_only_pending_messages(sb):
    ids = [sb.write("q", f"m{i}") for i in range(5)]
    sb.claim_one("q", exact_timestamp=ids[3])
    new = sb.write("q", "new", keep_newest=3)
    assert sb.peek_many("q") == [("m2", ids[2]), ("m4", ids[4]), ("new", new)]
    assert sb.count_claimed_messages() == 3


def test_keep_newest_moves_displaced_rows_to_claimed(broker, raw, namespace):
    old = [broker.write("q", f"m{i}") for i in range(3)]
    new = broker.write("q", "new", keep_newest=2)
    assert without_meta(stored(raw, namespace)) == {
        "queues": ["q"],
        "pending": members("q", old[2], new),
        "claimed": members("q", old[0], old[1]),
        "bodies": body_map({old[0]: "m0", old[1]: "m1", old[2]: "m2", new: "new"}),
    }


def test_keep_newest_refuses_to_displace_a_reserved_message(broker, raw, namespace, runner):
    old = broker.write("q", "held")
    lease = Leases(runner).reserve("q", 1, 60)
    assert lease.ids == (old,)
    before = stored(raw, namespace)
    with pytest.raises(ReservationConflict):
        broker.write("q", "new", keep_newest=1)
    assert stored(raw, namespace) == before
    # A window that keeps the reserved message is fine.
    new = broker.write("q", "new", keep_newest=2)
    assert broker.get_queue_stat("q").pending == 2
    Leases(runner).commit(lease.token)
    assert broker.peek_many("q") == [("new", new)]
    assert raw.zrange(Keyspace.for_namespace(namespace).claimed, 0, -1) == members("q", old)
