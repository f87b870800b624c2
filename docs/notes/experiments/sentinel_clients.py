"""redis-py's Sentinel clients (sync and asyncio): passwords, a blocking pool, failover, Pub/Sub."""

import asyncio
import time

import redis
import redis.asyncio
import redis.asyncio.sentinel as asentinel
from redis.backoff import NoBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelConnectionPool

from simplebroker_redis.devserver import DevSentinelGroup

DATA_PW, SENTINEL_PW = "data-pw", "sentinel-pw"
NO_RETRY = Retry(NoBackoff(), 0)


class SentinelBlockingConnectionPool(SentinelConnectionPool, redis.BlockingConnectionPool):
    """Sentinel address discovery + BlockingConnectionPool's max_connections/timeout."""


class AsyncSentinelBlockingConnectionPool(asentinel.SentinelConnectionPool, redis.asyncio.BlockingConnectionPool):
    """The same composition for asyncio."""


def show(label: str, call) -> None:
    start = time.monotonic()
    try:
        outcome = repr(call())
    except redis.RedisError as exc:
        outcome = f"{type(exc).__name__}: {exc}"[:120]
    print(f"{label:56} -> {outcome} ({time.monotonic() - start:.2f} s)")


with DevSentinelGroup(1, password=DATA_PW, sentinel_password=SENTINEL_PW) as g:
    print("server:", g.primary().call("INFO", "server").get("valkey_version") or g.primary().call("INFO", "server")["redis_version"])
    # 1. Passwords: connection kwargs go to data nodes only; sentinels need sentinel_kwargs.
    only_data = Sentinel(g.sentinel_addresses, password=DATA_PW, socket_timeout=1)
    show("password= only (sentinels get no password)", lambda: only_data.discover_master("mymaster"))
    both = Sentinel(g.sentinel_addresses, sentinel_kwargs={"password": SENTINEL_PW, "socket_timeout": 1},
                    password=DATA_PW, socket_timeout=1)
    show("sentinel_kwargs={'password': ...} + password=", lambda: both.discover_master("mymaster"))

    # 2. A blocking pool composed from SentinelConnectionPool and BlockingConnectionPool.
    blocking = both.master_for("mymaster", connection_pool_class=SentinelBlockingConnectionPool,
                               max_connections=1, timeout=0.3, retry=NO_RETRY)
    print("pool type:", type(blocking.connection_pool).__mro__[1:4])
    held = blocking.connection_pool.get_connection()
    show("blocking pool, 1 connection held, SET", lambda: blocking.set("k", 1))
    blocking.connection_pool.release(held)
    show("blocking pool, released, SET", lambda: blocking.set("k", 1))

    # 3. Failover seen by clients with and without retries.
    no_retry = both.master_for("mymaster", retry=NO_RETRY, decode_responses=True)
    default = both.master_for("mymaster", decode_responses=True)
    for client in (no_retry, default, blocking):
        client.set("before", "1")
    pubsub_client = both.master_for("mymaster", decode_responses=True)
    p = pubsub_client.pubsub()
    p.subscribe("ch")
    p.get_message(timeout=1)
    old = g.primary()
    new = g.failover()
    print(f"--- failover {old.port} -> {new.port}")
    show("retry=0 client, first command", lambda: no_retry.set("after", "1"))
    show("retry=0 client, second command", lambda: no_retry.set("after", "1"))
    show("default client (10 retries), first command", lambda: default.set("after", "1"))
    show("blocking-pool client (retry=0), first command", lambda: blocking.set("after", "1"))
    show("blocking-pool client (retry=0), second command", lambda: blocking.set("after", "1"))
    print("master address now:", no_retry.connection_pool.get_master_address())

    # 4. Pub/Sub through a sentinel-managed connection across that failover.
    show("pubsub get_message after failover", lambda: p.get_message(timeout=1))
    new_client = redis.Redis(port=new.port, password=DATA_PW)
    print("PUBLISH on new primary ->", new_client.publish("ch", "after-failover"))
    show("pubsub get_message", lambda: p.get_message(timeout=1))
    show("pubsub get_message", lambda: p.get_message(timeout=1))

    # 5. READONLY: a primary demoted behind the sentinels' back keeps client connections.
    replica = next(n for n in g.nodes if n is not new)
    show("retry=0 client SET (connected to current primary)", lambda: no_retry.set("x", "1"))
    replica.call("REPLICAOF", "NO", "ONE")
    new.call("REPLICAOF", "127.0.0.1", replica.port)
    show("SET after a manual demotion", lambda: no_retry.set("x", "2"))
    show("SET again (sentinels still name the demoted node)", lambda: no_retry.set("x", "3"))
    new.call("REPLICAOF", "NO", "ONE")
    replica.call("REPLICAOF", "127.0.0.1", new.port)
    g.wait_stable()

    async def amain() -> None:
        s = asentinel.Sentinel(g.sentinel_addresses, sentinel_kwargs={"password": SENTINEL_PW},
                               password=DATA_PW, socket_timeout=1)
        m = s.master_for("mymaster", connection_pool_class=AsyncSentinelBlockingConnectionPool,
                         max_connections=1, timeout=0.3, retry=NO_RETRY, decode_responses=True)
        print("async pool type:", type(m.connection_pool).__mro__[1:4])
        print("async master:", await m.connection_pool.get_master_address(), await m.set("a", "1"))
        conn = await m.connection_pool.get_connection()
        start = time.monotonic()
        try:
            await m.get("a")
        except redis.RedisError as exc:
            print(f"async blocking pool exhausted -> {type(exc).__name__}: {exc} ({time.monotonic() - start:.2f} s)")
        await m.connection_pool.release(conn)
        psc = s.master_for("mymaster", decode_responses=True)  # default pool and retries
        ps = psc.pubsub()
        await ps.subscribe("ach")
        await ps.get_message(timeout=1)
        moved = await asyncio.to_thread(g.failover)
        print(f"--- async: failover -> {moved.port}")
        for label in ("retry=0 blocking-pool client, first command", "second command"):
            start = time.monotonic()
            try:
                outcome = repr(await m.set("a", "2"))
            except redis.RedisError as exc:
                outcome = f"{type(exc).__name__}: {exc}"
            print(f"{label:56} -> {outcome} ({time.monotonic() - start:.2f} s)")
        for _ in range(3):
            try:
                print("async pubsub get_message ->", await ps.get_message(timeout=1))
            except redis.RedisError as exc:
                print("async pubsub get_message ->", type(exc).__name__, exc)
            await redis.asyncio.Redis(port=moved.port, password=DATA_PW).publish("ach", "x")
        await ps.aclose()
        await psc.aclose()
        await m.aclose()

    asyncio.run(amain())
