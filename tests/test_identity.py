"""Message identity: ID allocation, the durable high-water mark and its caches."""

from __future__ import annotations

import threading
import time

import pytest

from simplebroker_redis import RedisRunner
from simplebroker_redis.core import RedisBrokerCore
from simplebroker_redis.keys import Keyspace
from support.state import body_map, members, stored, without_meta

COUNTER_MASK = (1 << 12) - 1


def _hybrid_in(seconds: float) -> int:
    """Return a hybrid ID whose physical part is ``seconds`` from now, counter 0."""
    return (time.time_ns() + round(seconds * 1e9)) & ~COUNTER_MASK


# -- contract (redis and the SQLite reference) ---------------------------------------


def test_generate_timestamp_persists_increasing_ids_without_rows(sb, open_core):
    first = sb.generate_timestamp()
    second = sb.get_ts()
    third = sb.generate_timestamp()
    assert 0 < first < second < third
    assert sb.get_cached_last_timestamp() == third
    assert open_core().refresh_last_timestamp() == third
    assert sb.list_queues() == []
    assert sb.status()["total_messages"] == 0


def test_fresh_handle_reads_zero_then_the_durable_high_water(sb, open_core):
    assert sb.get_cached_last_timestamp() == 0
    assert sb.refresh_last_timestamp() == 0
    written = sb.write("q", "x")
    assert open_core().get_cached_last_timestamp() == written


def test_cache_is_stale_until_refreshed(sb, open_core):
    other = open_core()
    mine = sb.write("q", "mine")
    assert sb.get_cached_last_timestamp() == mine
    theirs = other.write("q", "theirs")
    assert theirs > mine
    assert sb.get_cached_last_timestamp() == mine
    assert sb.refresh_last_timestamp() == theirs
    assert sb.get_cached_last_timestamp() == theirs


def test_write_returns_its_own_row_id_not_the_high_water(sb, open_core):
    first = sb.write("q", "one")
    later = open_core().write("q", "two")
    assert sb.peek_one("q", exact_timestamp=first) == ("one", first)
    assert sb.refresh_last_timestamp() == later != first
    assert sb.claim_one("q") == ("one", first)


def test_advance_last_timestamp_is_a_monotone_durable_floor(sb, open_core):
    floor = sb.generate_timestamp() + 10**9
    assert sb.advance_last_timestamp(floor) == floor
    assert sb.get_cached_last_timestamp() == floor
    assert open_core().refresh_last_timestamp() == floor
    # Never lowered, and the answer is the durable value.
    assert sb.advance_last_timestamp(floor - 7) == floor
    assert sb.advance_last_timestamp(0) == floor
    assert sb.write("q", "after") > floor


def test_advance_last_timestamp_returns_a_higher_concurrent_winner(sb, open_core):
    other = open_core()
    floor = sb.refresh_last_timestamp() + 1000
    winner = other.advance_last_timestamp(floor + 5000)
    assert sb.advance_last_timestamp(floor) == winner == floor + 5000


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (None, TypeError),
        (True, TypeError),
        (False, TypeError),
        (1.5, TypeError),
        ("1795000000000000000", TypeError),
        (-1, ValueError),
        (2**63, ValueError),
    ],
)
def test_advance_last_timestamp_rejects_bad_floors_without_change(sb, value, error):
    before = sb.generate_timestamp()
    with pytest.raises(error):
        sb.advance_last_timestamp(value)
    assert sb.refresh_last_timestamp() == before


def test_ids_from_threads_sharing_one_handle_are_unique(sb):
    results: list[list[int]] = [[] for _ in range(4)]

    def work(slot: int) -> None:
        for i in range(50):
            if i % 2:
                results[slot].append(sb.write("q", f"{slot}-{i}"))
            else:
                results[slot].append(sb.generate_timestamp())

    threads = [threading.Thread(target=work, args=(slot,)) for slot in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    every = [value for chunk in results for value in chunk]
    assert len(set(every)) == 200
    for chunk in results:
        assert chunk == sorted(chunk)
    assert sb.refresh_last_timestamp() == max(every)


# -- redis: how the durable high-water is stored and allocated ---------------------


def test_high_water_is_stored_as_19_digits(broker, raw, namespace):
    meta = Keyspace.for_namespace(namespace).meta
    assert raw.hget(meta, "last_ts") == "0" * 19
    written = broker.write("q", "x")
    assert raw.hget(meta, "last_ts") == f"{written:019d}"
    stamp = broker.generate_timestamp()
    assert raw.hget(meta, "last_ts") == f"{stamp:019d}"
    # generate_timestamp created no message.
    assert without_meta(stored(raw, namespace)) == {
        "queues": ["q"],
        "pending": members("q", written),
        "bodies": body_map({written: "x"}),
    }


def test_cache_ahead_of_durable_state_still_advances_durably(broker, redis_url, namespace):
    # An existing-only broadcast that reaches no queue reserves a local
    # candidate but commits nothing, so this handle's cache runs ahead.
    assert broker.broadcast("x", queue_names=["missing"]) == 0
    cached = broker.get_cached_last_timestamp()
    reader = RedisBrokerCore(RedisRunner(redis_url, namespace=namespace), owns_runner=True)
    try:
        assert reader.refresh_last_timestamp() < cached
        assert broker.advance_last_timestamp(cached) == cached
        assert reader.refresh_last_timestamp() == cached
    finally:
        reader.shutdown()


def test_lagging_client_clock_writes_above_another_writers_high_water(broker, raw, namespace):
    broker.refresh_last_timestamp()  # cache the current (low) high-water
    ahead = _hybrid_in(5.0)
    raw.hset(Keyspace.for_namespace(namespace).meta, "last_ts", f"{ahead:019d}")
    written = broker.write("q", "late clock")
    assert written == ahead + 1
    assert broker.peek_many("q") == [("late clock", ahead + 1)]
    assert broker.refresh_last_timestamp() == ahead + 1


def test_exhausted_logical_counter_waits_for_the_clock(broker, raw, namespace):
    exhausted = _hybrid_in(0.05) | COUNTER_MASK
    raw.hset(Keyspace.for_namespace(namespace).meta, "last_ts", f"{exhausted:019d}")
    written = broker.write("q", "x")
    assert written > exhausted
    assert written & COUNTER_MASK == 0
    assert written & ~COUNTER_MASK <= time.time_ns()
    assert broker.peek_many("q") == [("x", written)]


def test_stored_id_collision_is_skipped(broker, raw, namespace):
    keys = Keyspace.for_namespace(namespace)
    broker.refresh_last_timestamp()
    ahead = _hybrid_in(5.0)
    raw.hset(keys.meta, "last_ts", f"{ahead:019d}")
    raw.hset(keys.bodies, f"{ahead + 1:019d}", "ghost")  # damaged: a body above high-water
    written = broker.write("q", "x")
    assert written == ahead + 2
    assert raw.zrange(keys.pending, 0, -1) == members("q", ahead + 2)


def test_stop_event_interrupts_id_collision_backoff_without_writing(
    broker, raw, namespace, redis_url
):
    keys = Keyspace.for_namespace(namespace)
    stopping = RedisBrokerCore(RedisRunner(redis_url, namespace=namespace), owns_runner=True)
    try:
        stopping.refresh_last_timestamp()
        ahead = _hybrid_in(5.0)
        raw.hset(keys.meta, "last_ts", f"{ahead:019d}")
        raw.hset(keys.bodies, f"{ahead + 1:019d}", "ghost")
        stop = threading.Event()
        stop.set()
        stopping.set_stop_event(stop)
        started = time.monotonic()
        with pytest.raises(RuntimeError, match="allocate a message ID"):
            stopping.write("q", "x")
        assert time.monotonic() - started < 2
        assert raw.hget(keys.meta, "last_ts") == f"{ahead:019d}"
        assert raw.exists(keys.pending) == 0
        stopping.set_stop_event(None)  # back to an unset event: the write goes through
        assert stopping.write("q", "x") == ahead + 2
    finally:
        stopping.shutdown()


def test_conflict_metrics_are_reported_and_reset(sb):
    # BrokerCore's monitoring surface (not in the BrokerConnection protocol,
    # but the shared suite calls it on every backend).
    for i in range(5):
        sb.write("q", f"m{i}")
    assert sb.get_conflict_metrics() == {"ts_conflict_count": 0, "ts_resync_count": 0}
    sb.reset_conflict_metrics()
    assert sb.get_conflict_metrics() == {"ts_conflict_count": 0, "ts_resync_count": 0}
