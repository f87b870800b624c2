"""Connections the script path keeps out of the pool between calls (``runner.wire.direct``).

Scripts skip redis-py's checkout and release by keeping a few idle
connections; these tests hold that to what the pool promised: a bounded
number kept, a connection the server closed is replaced before the send,
error replies and forks leave nothing shared or dirty, and Sentinel pools
keep none.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import uuid
from typing import Any

import pytest
import redis
import redis.sentinel

from simplebroker_redis import RedisRunner
from simplebroker_redis.core import RedisBrokerCore
from simplebroker_redis.namespace import cleanup
from simplebroker_redis.runner import direct, keep_limit, wire


def kept_connections(pool: Any) -> int:
    """Return how many idle connections :func:`direct` holds out of ``pool`` now."""
    idle = getattr(pool, wire._IDLE_ATTRIBUTE, None)
    return 0 if idle is None else len(idle.connections)


def _write_and_claim(core: RedisBrokerCore, count: int) -> None:
    for i in range(count):
        core.write("jobs", f"m{i}")
    assert [core.claim_one("jobs", with_timestamps=False) for _ in range(count)] == [
        f"m{i}" for i in range(count)
    ]


def test_one_thread_writes_and_claims_on_one_kept_connection(broker, runner):
    pool = runner.client.connection_pool
    _write_and_claim(broker, 20)
    assert keep_limit(pool) == 4  # 50 connections by default: one in eight, at most 4
    assert kept_connections(pool) == 1
    kept = direct(runner.client, ("CLIENT", "ID"))
    broker.write("jobs", "again")
    assert direct(runner.client, ("CLIENT", "ID")) == kept  # the same socket every time


def test_sentinel_pools_keep_nothing(shared_sentinel):
    # redis-py re-points idle Sentinel connections at a new primary only
    # while they sit in the pool.
    runner = RedisRunner(
        shared_sentinel.url, namespace=f"kept-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    )
    core = RedisBrokerCore(runner, owns_runner=True)
    _write_and_claim(core, 5)
    pool = runner.client.connection_pool
    assert isinstance(pool, redis.sentinel.SentinelConnectionPool)
    assert keep_limit(pool) == 0
    assert kept_connections(pool) == 0
    cleanup(runner)
    core.shutdown()


def test_small_pools_keep_nothing(redis_url, namespace):
    runner = RedisRunner(redis_url, namespace=namespace, max_connections=7)
    core = RedisBrokerCore(runner, owns_runner=True)
    core.write("jobs", "x")
    pool = runner.client.connection_pool
    assert keep_limit(pool) == 0
    assert kept_connections(pool) == 0
    assert core.claim_one("jobs", with_timestamps=False) == "x"
    core.shutdown()


def test_threads_racing_keep_at_most_the_limit_and_lose_nothing(redis_url, namespace, raw):
    runner = RedisRunner(redis_url, namespace=namespace, max_connections=16)
    core = RedisBrokerCore(runner, owns_runner=True)
    pool = runner.client.connection_pool
    assert keep_limit(pool) == 2
    claimed: list[str] = []
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def work(n: int) -> None:
        try:
            start.wait(10)
            for i in range(40):
                core.write("jobs", f"{n}-{i}")
                body = core.claim_one("jobs", with_timestamps=False)
                if body is not None:
                    claimed.append(body)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    rest = []
    while (body := core.claim_one("jobs", with_timestamps=False)) is not None:
        rest.append(body)
    assert sorted(claimed + rest) == sorted(f"{n}-{i}" for n in range(8) for i in range(40))
    assert 1 <= kept_connections(pool) <= 2
    # Everything not kept went back: the pool hands out all the others at once.
    others = [pool.get_connection() for _ in range(16 - kept_connections(pool))]
    for connection in others:
        pool.release(connection)
    core.shutdown()


def test_a_kept_connection_the_server_closed_is_replaced_before_the_send(broker, runner, raw):
    broker.write("jobs", "first")
    kept = direct(runner.client, ("CLIENT", "ID"))
    assert raw.client_kill_filter(_id=kept) == 1
    # A write is never retried (its reply could hide a commit): it must not
    # be sent on the dead socket at all.
    broker.write("jobs", "second")
    assert direct(runner.client, ("CLIENT", "ID")) != kept
    assert broker.peek_many("jobs", 10, with_timestamps=False) == ["first", "second"]


def test_an_error_reply_leaves_the_connection_clean(broker, runner):
    broker.write("jobs", "x")
    with pytest.raises(redis.ResponseError, match="unknown command|ERR"):
        direct(runner.client, ("NOSUCHCOMMAND", "a"))
    assert direct(runner.client, ("PING",)) in (True, "PONG", b"PONG")
    assert broker.claim_one("jobs", with_timestamps=False) == "x"


def _child(runner: RedisRunner, client: redis.Redis, out: Any) -> None:
    core = RedisBrokerCore(runner)
    core.write("jobs", "from the child")
    body = core.claim_one("jobs", with_timestamps=False)
    out.put((direct(runner.client, ("CLIENT", "ID")), direct(client, ("CLIENT", "ID")), body))


def test_a_forked_child_never_uses_its_parents_kept_connections(redis_url, namespace):
    runner = RedisRunner(redis_url, namespace=namespace)
    core = RedisBrokerCore(runner)
    core.write("jobs", "from the parent")
    assert core.claim_one("jobs", with_timestamps=False) == "from the parent"
    kept = direct(runner.client, ("CLIENT", "ID"))
    # A client outside any runner: only the fork hook keeps its kept
    # connection from the child (a runner builds a new pool in a child).
    client = redis.Redis(connection_pool=redis.BlockingConnectionPool.from_url(redis_url))
    client_kept = direct(client, ("CLIENT", "ID"))
    assert kept_connections(client.connection_pool) == 1
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    child = context.Process(target=_child, args=(runner, client, out))
    child.start()
    child_kept, child_client_kept, body = out.get(timeout=30)
    child.join(10)
    assert child.exitcode == 0
    assert body == "from the child"
    assert child_kept != kept
    assert child_client_kept != client_kept
    # The parent's connections were not touched: they still answer in order.
    assert direct(runner.client, ("CLIENT", "ID")) == kept
    assert direct(client, ("CLIENT", "ID")) == client_kept
    core.write("jobs", "parent again")
    assert core.claim_one("jobs", with_timestamps=False) == "parent again"
    client.close()
    runner.shutdown()
