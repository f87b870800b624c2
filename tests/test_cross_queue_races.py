"""Broadcast, aliases and keep_newest racing other processes on one server."""

from __future__ import annotations

import multiprocessing
from multiprocessing.synchronize import Event as EventType

import pytest
from simplebroker import resolve_config

from simplebroker_redis import Leases, RedisRunner, ReservationConflict
from simplebroker_redis.core import RedisBrokerCore

ROUNDS = 10


def _core(url: str, namespace: str) -> RedisBrokerCore:
    return RedisBrokerCore(RedisRunner(url, namespace=namespace))


def _delete_all(url: str, namespace: str, prefix: str, go: EventType) -> None:
    core = _core(url, namespace)
    go.wait()
    for i in range(40):
        core.delete(f"{prefix}{i}")


def _create_all(url: str, namespace: str, prefix: str, go: EventType) -> None:
    core = _core(url, namespace)
    go.wait()
    for i in range(40):
        core.write(f"{prefix}{i}", "first")


@pytest.mark.parametrize("selector", ["all", "exact"])
def test_broadcast_never_resurrects_a_deleted_queue(redis_url, namespace, selector):
    core = _core(redis_url, namespace)
    context = multiprocessing.get_context("fork")
    for round_ in range(ROUNDS):
        prefix = f"d{round_}-"
        names = [f"{prefix}{i}" for i in range(40)]
        for name in names:
            core.write(name, "seed")
        go = context.Event()
        deleter = context.Process(target=_delete_all, args=(redis_url, namespace, prefix, go))
        deleter.start()
        go.set()
        if selector == "all":
            reached = core.broadcast("hello")
        else:
            reached = core.broadcast("hello", queue_names=names)
        deleter.join(timeout=30)
        assert deleter.exitcode == 0
        assert 0 <= reached <= 40
        # Every queue was deleted after or before the broadcast; a copy landing
        # in an already-deleted queue would have recreated it.
        assert [q for q in core.list_queues() if q.startswith(prefix)] == []


def test_patternless_broadcast_never_misses_a_queue_committed_before_it(redis_url, namespace):
    core = _core(redis_url, namespace)
    context = multiprocessing.get_context("fork")
    for round_ in range(ROUNDS):
        prefix = f"c{round_}-"
        go = context.Event()
        creator = context.Process(target=_create_all, args=(redis_url, namespace, prefix, go))
        creator.start()
        go.set()
        core.broadcast("hello", pattern=None)
        creator.join(timeout=30)
        assert creator.exitcode == 0
        copy_id = None
        for i in range(40):
            rows = core.peek_many(f"{prefix}{i}", 10)
            bodies = {body for body, _ in rows}
            if "hello" in bodies:
                copy_id = next(mid for body, mid in rows if body == "hello")
        for i in range(40):
            rows = core.peek_many(f"{prefix}{i}", 10)
            created = min(mid for body, mid in rows if body == "first")
            got_copy = any(body == "hello" for body, _ in rows)
            # IDs follow commit order: a queue whose first write committed
            # before the broadcast must hold a copy, a later one must not.
            if copy_id is not None and created < copy_id:
                assert got_copy, f"{prefix}{i} existed before the broadcast but missed it"
            if copy_id is None or created > copy_id:
                assert not got_copy


def _add_alias(url: str, namespace: str, alias: str, target: str, go: EventType, out) -> None:  # type: ignore[no-untyped-def]
    core = _core(url, namespace)
    go.wait()
    try:
        core.add_alias(alias, target)
    except ValueError:
        out.put((alias, False))
    else:
        out.put((alias, True))


def test_concurrent_alias_adds_keep_the_map_flat(redis_url, namespace):
    core = _core(redis_url, namespace)
    context = multiprocessing.get_context("fork")
    for round_ in range(ROUNDS):
        a, b, c = f"a{round_}", f"b{round_}", f"c{round_}"
        go = context.Event()
        out = context.Queue()
        procs = [
            context.Process(target=_add_alias, args=(redis_url, namespace, a, b, go, out)),
            context.Process(target=_add_alias, args=(redis_url, namespace, b, c, go, out)),
        ]
        for proc in procs:
            proc.start()
        go.set()
        results = dict(out.get(timeout=30) for _ in procs)
        for proc in procs:
            proc.join(timeout=30)
        assert sorted(results.values()) == [False, True]  # exactly one winner
    aliases = dict(core.list_aliases())
    assert len(aliases) == ROUNDS
    assert not set(aliases) & set(aliases.values())  # no alias points at an alias


def test_keep_newest_against_an_active_reservation(broker, runner, raw, namespace):
    leases = Leases(runner)
    ids = [broker.write("window", f"m{i}") for i in range(5)]
    lease = leases.reserve("window", 1, 30)  # reserves the oldest, m0
    last_ts = raw.hget(f"sb:{{{namespace}}}:meta", "last_ts")
    with pytest.raises(ReservationConflict):
        broker.write("window", "new", keep_newest=3)
    # No write, no claim, no high-water change.
    assert raw.hget(f"sb:{{{namespace}}}:meta", "last_ts") == last_ts
    stat = broker.get_queue_stat("window")
    assert (stat.pending, stat.claimed) == (5, 0)
    leases.release(lease.token)
    # A reservation inside the kept window is no conflict.
    newest = leases.reserve("window", 1, 30, order="newest")
    assert newest.ids == (ids[4],)
    new_id = broker.write("window", "new", keep_newest=3)
    assert [i for _, i in broker.peek_many("window", 10)] == [ids[3], ids[4], new_id]
    stat = broker.get_queue_stat("window")
    assert (stat.pending, stat.claimed) == (3, 3)
    assert leases.ack(newest.token).settled == 1


def test_keep_newest_racing_reservers_never_loses_or_duplicates(redis_url, namespace):
    # Automatic vacuum would remove claimed rows this test counts.
    no_vacuum = resolve_config(override={"BROKER_AUTO_VACUUM": 0})
    writer = RedisBrokerCore(RedisRunner(redis_url, namespace=namespace), config=no_vacuum)
    context = multiprocessing.get_context("fork")
    stop = context.Event()
    out = context.Queue()
    consumer = context.Process(target=_reserve_until, args=(redis_url, namespace, stop, out))
    consumer.start()
    written = []
    conflicts = 0
    for i in range(300):
        try:
            written.append(writer.write("latest", f"v{i}", keep_newest=2))
        except ReservationConflict:
            conflicts += 1
    stop.set()
    consumed = out.get(timeout=30)
    consumer.join(timeout=30)
    assert len(consumed) == len(set(consumed))
    states = {i for _, i in writer.peek_many("latest", 1000, include_claimed=True)}
    assert set(written) == states  # every committed write is stored exactly once
    assert writer.get_queue_stat("latest").pending <= 2
    assert len(written) + conflicts == 300


def _reserve_until(url: str, namespace: str, stop: EventType, out) -> None:  # type: ignore[no-untyped-def]
    leases = Leases(RedisRunner(url, namespace=namespace))
    consumed: list[int] = []
    while not stop.is_set():
        lease = leases.reserve("latest", 1, 30)
        if lease.messages:
            consumed.extend(lease.ids)
            leases.ack(lease.token)
    out.put(consumed)
