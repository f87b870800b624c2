"""At-least-once generators, stale-batch recovery and the lease API."""

from __future__ import annotations

import threading
import time

import pytest
from simplebroker.ext import DataError, OperationalError

from simplebroker_redis import (
    AsyncLeases,
    AsyncRedisRunner,
    Leases,
    RedisRunner,
    ReplicationTimeout,
    ReservationConflict,
    ReservationLost,
    calls,
)
from simplebroker_redis.calls import Call
from simplebroker_redis.core import RedisBrokerCore
from simplebroker_redis.types import DeadLetterAck, Lease, MultiLease, ValueWrite
from support.state import stored

#: Run on a single server, a Redis Cluster and a Sentinel group (conftest.py).
TOPOLOGIES = ("single", "cluster", "sentinel")


def _fill(core: RedisBrokerCore, queue: str, count: int) -> list[int]:
    return [core.write(queue, f"m{i}") for i in range(count)]


def _core(redis_url: str, namespace: str, **options: float) -> RedisBrokerCore:
    return RedisBrokerCore(RedisRunner(redis_url, namespace=namespace, **options))  # type: ignore[arg-type]


def test_batch_commits_only_after_the_whole_batch_was_yielded(broker, redis_url, namespace):
    ids = _fill(broker, "jobs", 5)
    other = _core(redis_url, namespace)
    gen = broker.claim_generator("jobs", delivery_guarantee="at_least_once", batch_size=3)
    seen = [next(gen) for _ in range(3)]
    assert [i for _, i in seen] == ids[:3]
    # Reserved, not yet committed: still pending for observers...
    assert broker.get_queue_stat("jobs").pending == 5
    assert [i for _, i in broker.peek_many("jobs", 10)] == ids
    # ...but nobody else can claim, move or delete them.
    assert other.claim_one("jobs", exact_timestamp=ids[0]) is None
    assert other.move_one("jobs", "elsewhere", exact_timestamp=ids[1]) is None
    with pytest.raises(ReservationConflict):
        other.delete_message_ids("jobs", [ids[2]])
    assert other.claim_one("jobs") == ("m3", ids[3])
    # The holder itself may not mutate from inside its open batch (as on SQLite).
    with pytest.raises(RuntimeError, match="separate BrokerDB/Queue instance"):
        broker.claim_one("jobs")
    assert next(gen) == ("m4", ids[4])  # commits the first batch, reserves the next
    stat = broker.get_queue_stat("jobs")
    assert (stat.pending, stat.claimed) == (1, 4)
    assert list(gen) == []
    assert broker.get_queue_stat("jobs").claimed == 5


def test_early_close_rolls_back_with_same_ids_and_order(broker, raw, namespace):
    ids = _fill(broker, "jobs", 4)
    gen = broker.claim_generator("jobs", delivery_guarantee="at_least_once", batch_size=10)
    assert next(gen)[1] == ids[0]
    assert next(gen)[1] == ids[1]
    gen.close()
    assert [i for _, i in broker.peek_many("jobs", 10)] == ids
    assert broker.get_queue_stat("jobs").claimed == 0
    assert raw.hlen(f"sb:{{{namespace}}}:tokens") == 0
    assert raw.zcard(f"sb:{{{namespace}}}:reserved") == 0
    assert [i for _, i in broker.claim_many("jobs", 10)] == ids


def test_move_generator_at_least_once_moves_on_commit(broker):
    ids = _fill(broker, "src", 3)
    moved = list(broker.move_generator("src", "dst", delivery_guarantee="at_least_once"))
    assert [i for _, i in moved] == ids
    assert broker.queue_exists("src") is False
    assert [i for _, i in broker.peek_many("dst", 10)] == ids
    _fill(broker, "src", 2)
    gen = broker.move_generator("src", "dst", delivery_guarantee="at_least_once")
    next(gen)
    gen.close()
    assert broker.get_queue_stat("src").pending == 2
    assert broker.get_queue_stat("dst").pending == 3


def test_exception_inside_batch_rolls_back(broker):
    ids = _fill(broker, "jobs", 3)

    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        for body, _ in broker.claim_generator("jobs", delivery_guarantee="at_least_once"):
            if body == "m1":
                raise Boom
    assert [i for _, i in broker.peek_many("jobs", 10)] == ids


def test_cross_thread_use_fails_loudly_and_keeps_state(broker):
    ids = _fill(broker, "jobs", 3)
    gen = broker.claim_generator("jobs", delivery_guarantee="at_least_once")
    assert next(gen)[1] == ids[0]
    errors: list[BaseException] = []

    def resume() -> None:
        try:
            next(gen)
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)

    thread = threading.Thread(target=resume)
    with pytest.warns(RuntimeWarning, match="thread"):
        thread.start()
        thread.join()
    assert len(errors) == 1 and isinstance(errors[0], RuntimeError)
    assert "thread" in str(errors[0])
    assert [i for _, i in broker.peek_many("jobs", 10)] == ids
    assert [i for _, i in broker.claim_many("jobs", 10)] == ids


def test_stale_batch_is_recovered_by_a_reader_and_late_commit_reports_loss(redis_url, namespace):
    holder = _core(redis_url, namespace, stale_batch_seconds=0.2)
    other = _core(redis_url, namespace)
    ids = _fill(holder, "jobs", 1)
    gen = holder.claim_generator("jobs", delivery_guarantee="at_least_once")
    next(gen)
    assert other.claim_one("jobs") is None
    time.sleep(0.3)  # the holder works past its lease
    assert [i for _, i in other.claim_many("jobs", 10)] == ids  # recovered on read
    with pytest.raises(ReservationLost, match="before the batch committed"):
        next(gen)  # the commit finds the batch taken over


def test_a_batch_past_its_lease_yields_nothing_more(redis_url, namespace):
    # Issue 42: a consumer stopped (SIGSTOP, a GC pause) past its lease used
    # to yield the rest of its batch, whose messages another reader may
    # have recovered and started meanwhile, and only then fail at the commit.
    holder = _core(redis_url, namespace, stale_batch_seconds=0.3)
    ids = _fill(holder, "jobs", 4)
    gen = holder.claim_generator("jobs", delivery_guarantee="at_least_once", batch_size=4)
    assert next(gen)[1] == ids[0]
    time.sleep(0.4)  # the holder is stopped past its lease
    other = _core(redis_url, namespace)
    assert [i for _, i in other.claim_many("jobs", 10)] == ids  # recovered by another reader
    with pytest.raises(ReservationLost, match="ran out"):
        next(gen)  # not ids[1]: another reader has it
    with pytest.raises(StopIteration):
        next(gen)
    assert holder.get_queue_stat("jobs").claimed == 4  # each consumed once, by the other


def test_a_batch_past_its_lease_is_released_for_the_next_reader(redis_url, namespace):
    holder = _core(redis_url, namespace, stale_batch_seconds=0.3)
    ids = _fill(holder, "jobs", 3)
    gen = holder.claim_generator("jobs", delivery_guarantee="at_least_once")
    assert next(gen)[1] == ids[0]
    time.sleep(0.4)  # nobody recovered it yet: the holder hands it all back
    with pytest.raises(ReservationLost, match="released"):
        next(gen)
    other = _core(redis_url, namespace)
    # No recovery needed: pending again at once, same IDs and order.
    assert [i for _, i in other.claim_many("jobs", 10)] == ids


def test_a_queue_read_generator_past_its_lease_stops_and_redelivers(redis_url, namespace):
    from simplebroker import Queue, resolve_config

    runner = RedisRunner(redis_url, namespace=namespace, stale_batch_seconds=0.3)
    config = resolve_config(override={"BROKER_GENERATOR_BATCH_SIZE": 4})
    queue = Queue("work", db_path=runner.broker_target, runner=runner, config=config)
    for i in range(4):
        queue.write(f"t{i}")
    seen: list[str] = []
    with pytest.raises(ReservationLost):
        for body in queue.read_generator(delivery_guarantee="at_least_once"):
            seen.append(body)
            time.sleep(0.4)  # the consumer is stopped past its lease
    assert seen == ["t0"]
    fresh = RedisRunner(redis_url, namespace=namespace)
    other = Queue("work", db_path=fresh.broker_target, runner=fresh)
    assert list(other.read_generator(delivery_guarantee="at_least_once")) == [
        "t0",
        "t1",
        "t2",
        "t3",
    ]


def test_negative_stale_batch_seconds_disables_recovery(redis_url, namespace):
    holder = _core(redis_url, namespace, stale_batch_seconds=-1)
    other = _core(redis_url, namespace)
    _fill(holder, "jobs", 1)
    gen = holder.claim_generator("jobs", delivery_guarantee="at_least_once")
    next(gen)
    time.sleep(0.2)
    assert other.recover_stale() == 0
    assert other.claim_one("jobs") is None
    gen.close()
    assert other.claim_one("jobs") is not None


def test_quiet_queue_gets_stranded_messages_back_by_explicit_recovery(redis_url, namespace):
    holder = _core(redis_url, namespace, stale_batch_seconds=0.1)
    _fill(holder, "quiet", 3)
    gen = holder.claim_generator("quiet", delivery_guarantee="at_least_once")
    next(gen)
    time.sleep(0.2)
    other = _core(redis_url, namespace)
    assert other.recover_stale("quiet") == 3
    assert other.recover_stale() == 0
    assert other.get_queue_stat("quiet").pending == 3


def test_lease_reserve_ack_release_and_delivery_counts(runner, broker):
    leases = Leases(runner)
    ids = _fill(broker, "tasks", 4)
    lease = leases.reserve("tasks", 3, 30)
    assert lease.ids == tuple(ids[:3])
    assert [m.deliveries for m in lease.messages] == [1, 1, 1]
    assert lease.deadline_ns is not None and lease.deadline_ns - lease.created_ns == 30 * 10**9
    assert leases.ack(lease.token, [ids[0]]).settled == 1
    assert leases.ack(lease.token, [ids[1]], delete=True).settled == 1
    assert leases.release(lease.token, [ids[2]]) == 1
    assert leases.ack(lease.token, [ids[2]]).lost == 1  # no longer held
    stat = broker.get_queue_stat("tasks")
    assert (stat.pending, stat.claimed) == (2, 1)
    assert broker.peek_one("tasks", exact_timestamp=ids[1]) is None
    again = leases.reserve("tasks", 10, 30)
    assert again.ids == (ids[2], ids[3])
    assert [m.deliveries for m in again.messages] == [2, 1]
    assert leases.deliveries(ids[2]) == 2
    assert leases.release(again.token, undeliver=True) == 2
    assert leases.deliveries(ids[2]) == 1


def test_release_with_delay_hides_then_returns_messages(runner, broker):
    leases = Leases(runner)
    (mid,) = _fill(broker, "tasks", 1)
    lease = leases.reserve("tasks", 1, 30)
    assert leases.release(lease.token, delay_seconds=0.3) == 1
    assert broker.get_queue_stat("tasks").pending == 1  # delayed is still pending...
    assert broker.claim_one("tasks") is None  # ...but not claimable yet
    soon = leases.reserve("tasks", 1, 30)
    assert soon.messages == () and soon.next_due_seconds is not None
    assert 0 < soon.next_due_seconds <= 0.3
    time.sleep(0.35)
    assert broker.claim_one("tasks") == ("m0", mid)


def test_renewal_keeps_a_long_holder_safe_past_several_lease_lengths(runner, broker):
    leases = Leases(runner)
    _fill(broker, "tasks", 1)
    lease = leases.reserve("tasks", 1, 0.2)
    for _ in range(6):  # 0.6 s = three lease lengths
        time.sleep(0.1)
        assert leases.renew([lease.token]) == set()
        assert leases.recover().released == 0
    assert leases.ack(lease.token).settled == 1
    assert leases.renew([lease.token]) == {lease.token}


def test_two_recoverers_never_recover_the_same_token_twice(
    runner, broker, redis_url, namespace, raw
):
    leases = Leases(runner)
    _fill(broker, "tasks", 50)
    tokens = [leases.reserve("tasks", 5, 0.2).token for _ in range(10)]
    assert len(set(tokens)) == 10
    time.sleep(0.3)
    # On a loaded machine a later reservation can already have recovered an
    # earlier, expired one (reservations carry recovery): count what is held.
    held = raw.zcard(f"sb:{{{namespace}}}:reserved")
    assert held >= 5
    results: list[int] = []

    def recover() -> None:
        mine = Leases(RedisRunner(redis_url, namespace=namespace))
        total = 0
        for _ in range(20):
            total += mine.recover("tasks", max_tokens=1).released
        results.append(total)

    threads = [threading.Thread(target=recover) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(results) == held
    assert broker.get_queue_stat("tasks").pending == 50
    assert len(broker.claim_many("tasks", 100)) == 50


def test_recovery_racing_a_commit_never_loses_or_duplicates(runner, broker, redis_url, namespace):
    leases = Leases(runner)
    for round_ in range(20):
        queue = f"race{round_}"
        ids = _fill(broker, queue, 3)
        lease = leases.reserve(queue, 3, 0.01)
        time.sleep(0.02)
        other = Leases(RedisRunner(redis_url, namespace=namespace))
        outcome: list[int] = []

        def recover(mine: Leases = other, name: str = queue, out: list[int] = outcome) -> None:
            out.append(mine.recover(name).released)

        racer = threading.Thread(target=recover)
        racer.start()
        settled = leases.ack(lease.token)
        racer.join()
        recovered = outcome[0]
        assert settled.settled + recovered == 3
        stat = broker.get_queue_stat(queue)
        assert (stat.pending, stat.claimed) == (recovered, settled.settled)
        assert sorted(i for _, i in broker.peek_many(queue, 10, include_claimed=True)) == ids


def test_delete_racing_a_reservation(broker, runner):
    leases = Leases(runner)
    _fill(broker, "a", 2)
    _fill(broker, "b", 2)
    _fill(broker, "c", 2)
    lease = leases.reserve("b", 1, 30)
    with pytest.raises(ReservationConflict):
        broker.delete("b")
    assert broker.get_queue_stat("b").total == 2
    with pytest.raises(ReservationConflict):
        broker.delete()
    # Registry order is a, b, c: a was deleted, b and c stay intact.
    assert broker.queue_exists("a") is False
    assert broker.get_queue_stat("b").total == 2
    assert broker.get_queue_stat("c").total == 2
    with pytest.raises(ReservationConflict):
        broker.delete_from_queues(["c", "b"])
    assert broker.get_queue_stat("c").total == 2
    leases.ack(lease.token)
    assert broker.delete() == 4
    assert broker.list_queues() == []


def test_max_deliveries_sends_expired_message_to_dead_letter(runner, broker):
    leases = Leases(runner)
    (mid,) = _fill(broker, "tasks", 1)
    for attempt in (1, 2):
        lease = leases.reserve("tasks", 1, 0.01, max_deliveries=2, dead_letter="tasks.dead")
        assert lease.messages[0].deliveries == attempt
        time.sleep(0.02)
        assert leases.recover().released == 1
    assert broker.peek_many("tasks", 10) == []
    assert broker.peek_many("tasks.dead", 10) == [("m0", mid)]
    lease = leases.reserve("tasks.dead", 1, 30)
    assert leases.reject(lease.token, None, "tasks.final").settled == 1
    assert broker.peek_many("tasks.final", 10) == [("m0", mid)]


def test_dead_letters_are_journaled_until_acknowledged_once(runner, broker, raw, namespace):
    leases = Leases(runner)
    first, second, survivor = _fill(broker, "tasks", 3)
    other = broker.write("elsewhere", "x")
    # By recovery (an expired last delivery) and by release, from two queues.
    lease = leases.reserve("tasks", 1, 0.01, max_deliveries=1, dead_letter="tasks.dead")
    time.sleep(0.02)
    assert leases.recover().released == 1
    lease = leases.reserve("tasks", 2, 30, max_deliveries=2, dead_letter="tasks.dead")
    leases.release(lease.token)  # one delivery of two: pending again, not journaled
    lease = leases.reserve("elsewhere", 1, 30, max_deliveries=1, dead_letter="elsewhere.dead")
    leases.release(lease.token)
    lease = leases.reserve("tasks", 1, 30, max_deliveries=2, dead_letter="tasks.dead")
    leases.release(lease.token, undeliver=True)  # handed back unrun: never dead
    lease = leases.reserve("tasks", 1, 30, max_deliveries=2, dead_letter="tasks.dead")
    leases.release(lease.token)
    assert [i for _, i in broker.peek_many("tasks.dead", 10)] == [first, second]
    assert raw.xlen(f"sb:{{{namespace}}}:dead_letters") == 3

    page = leases.dead_letters(["tasks"], limit=10)
    assert [(e.queue, e.dead_letter_queue, e.id, e.deliveries, e.body) for e in page.entries] == [
        ("tasks", "tasks.dead", first, 1, "m0"),
        ("tasks", "tasks.dead", second, 2, "m1"),
    ]
    assert not page.more
    assert leases.dead_letters(["tasks"], after=page.cursor).entries == ()
    both = leases.dead_letters(["tasks", "elsewhere"], limit=2)
    assert [e.id for e in both.entries] == [first, other] and both.more
    assert [e.id for e in leases.dead_letters(["tasks"], after=both.cursor).entries] == [second]

    # One of any number of acknowledgements takes the entry, and stores the
    # value only where none is.
    entry = page.entries[0]
    result = ValueWrite(runner.keys.result_key("t1"), "dead", 60_000)
    assert leases.dead_letter_ack(entry.entry, result) == DeadLetterAck(True, True)
    assert leases.dead_letter_ack(entry.entry, result) == DeadLetterAck(False, False)
    assert 0 < raw.pttl(runner.keys.result_key("t1")) <= 60_000
    raw.set(runner.keys.result_key("t2"), "finished")
    kept = ValueWrite(runner.keys.result_key("t2"), "dead", None)
    assert leases.dead_letter_ack(page.entries[1].entry, kept) == DeadLetterAck(True, False)
    assert raw.get(runner.keys.result_key("t2")) == "finished"
    assert [e.id for e in leases.dead_letters(["tasks", "elsewhere"]).entries] == [other]
    # A message deleted before its entry was read has no body any more.
    broker.delete("elsewhere.dead")
    [gone] = leases.dead_letters(["elsewhere"]).entries
    assert gone.body is None
    assert leases.dead_letter_ack(gone.entry).acked
    assert raw.xlen(f"sb:{{{namespace}}}:dead_letters") == 0
    assert [i for _, i in broker.peek_many("tasks", 10)] == [survivor]


def test_dead_letter_calls_refuse_malformed_arguments(runner):
    leases = Leases(runner)
    for bad in ("", "12", "1-x", "(1-0"):
        with pytest.raises(ValueError):
            leases.dead_letter_ack(bad)
        with pytest.raises(ValueError):
            leases.dead_letters(["q"], after=bad)
    with pytest.raises(ValueError):
        leases.dead_letters([])
    with pytest.raises(ValueError):
        leases.dead_letters(["q"], limit=0)


def test_an_ordered_reservation_refuses_bad_sources_every_time(runner, broker, raw, namespace):
    """reserve_queues validates its sources on the client before anything changes; a
    worker's sources are remembered once valid, and that never lets a bad call through."""
    leases = Leases(runner)
    ids = _fill(broker, "tasks", 2)
    sources = [("tasks.p1", "dead"), ("tasks", "dead")]
    before = stored(raw, namespace)
    bad_calls: list[tuple[object, ...]] = [
        ([], 1, None),  # no source
        ([("tasks", None), ("tasks", None)], 1, None),  # a queue twice
        ([("bad name!", None)], 1, None),
        ([("tasks", "tasks")], 1, 1),  # its own dead-letter queue
        ([("tasks", None)], 1, 2),  # max_deliveries without a dead-letter queue
        (sources, 0, 2),  # no room
        (sources, True, 2),
        (sources, 1, 0),
    ]
    for rounds in range(2):  # before and after the same sources were valid
        for bad_sources, limit, max_deliveries in bad_calls:
            with pytest.raises((ValueError, TypeError)):
                leases.reserve_queues(
                    bad_sources,  # type: ignore[arg-type]
                    limit,  # type: ignore[arg-type]
                    30,
                    max_deliveries=max_deliveries,  # type: ignore[arg-type]
                )
        # True is not a count, though True == 1 (and hashes alike).
        with pytest.raises(TypeError, match="max_deliveries must be an integer"):
            leases.reserve_queues(sources, 1, 30, max_deliveries=True)
        assert stored(raw, namespace) == before
        if rounds == 0:
            held = leases.reserve_queues(sources, 1, 30, max_deliveries=1)
            assert held.messages[0].id == ids[0]
            assert leases.ack(held.leases[0].token, delete=True).settled == 1
            before = stored(raw, namespace)


def test_settle_refuses_an_unknown_mode_before_anything_changes(runner, broker, raw, namespace):
    leases = Leases(runner)
    ids = _fill(broker, "tasks", 2)
    lease = leases.reserve("tasks", 2, 30)
    before = stored(raw, namespace)
    # The typed call refuses the mode on the client; the script refuses it too.
    bad = Call(list, "settle", (lease.token, "explode", "", f"{ids[0]:019d}"))
    with pytest.raises(ValueError, match="settlement mode"):
        runner.run(bad)
    assert stored(raw, namespace) == before
    assert leases.ack(lease.token).settled == 2


def test_renew_validates_every_token_before_renewing_any(runner, broker, raw, namespace):
    leases = Leases(runner)
    _fill(broker, "tasks", 2)
    first = leases.reserve("tasks", 1, 30)
    second = leases.reserve("tasks", 1, 30)
    tokens_key = f"sb:{{{namespace}}}:tokens"
    raw.hset(tokens_key, second.token, "not json")
    before = stored(raw, namespace)
    with pytest.raises(DataError, match="damaged record"):
        leases.renew([first.token, second.token], 300)
    # The healthy token listed first was not renewed either.
    assert stored(raw, namespace) == before


def test_a_reused_token_is_a_retryable_error(runner, broker):
    leases = Leases(runner)
    _fill(broker, "tasks", 2)
    lease = leases.reserve("tasks", 1, 30)
    args = list(calls.reserve("tasks", 1, 30).args)
    args[1] = lease.token
    with pytest.raises(OperationalError, match="is in use") as caught:
        runner.run(Call(list, "reserve", tuple(args)))
    assert caught.value.retryable
    assert broker.get_queue_stat("tasks").pending == 2


#: More replicas than any test topology has: every WAIT comes back short.
UNMET = {"wait_replicas": 5, "wait_timeout": 0.05}


def test_an_unconfirmed_reservation_still_names_what_it_reserved(
    runner, broker, redis_url, namespace
):
    """ReplicationTimeout: the reservation happened; ``result`` is its lease, to hand back."""
    ids = _fill(broker, "jobs", 2)
    durable = RedisRunner(redis_url, namespace=namespace, **UNMET)  # type: ignore[arg-type]
    with pytest.raises(ReplicationTimeout, match="happened.*of 5 replicas") as info:
        Leases(durable).reserve("jobs", 10, 30.0)
    durable.shutdown()
    lease, leases = info.value.result, Leases(runner)
    assert isinstance(lease, Lease) and lease.ids == tuple(ids)
    assert [leases.deliveries(i) for i in ids] == [1, 1]
    assert broker.claim_one("jobs") is None  # held by that token
    assert leases.release(lease.token, undeliver=True) == 2
    assert [leases.deliveries(i) for i in ids] == [0, 0]
    assert broker.claim_one("jobs") == ("m0", ids[0])


async def test_an_unconfirmed_async_call_carries_its_parsed_result(
    runner, broker, redis_url, namespace
):
    ids = _fill(broker, "a", 1) + _fill(broker, "b", 1)
    durable = AsyncRedisRunner(redis_url, namespace=namespace, **UNMET)  # type: ignore[arg-type]
    try:
        with pytest.raises(ReplicationTimeout) as info:
            await AsyncLeases(durable).reserve_queues([("a", None), ("b", None)], 5, 30.0)
    finally:
        await durable.aclose()
    reserved = info.value.result
    assert isinstance(reserved, MultiLease)
    assert [message.id for message in reserved.messages] == ids
    leases = Leases(runner)
    assert sum(leases.release(lease.token) for lease in reserved.leases) == 2
