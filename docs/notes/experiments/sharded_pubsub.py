"""Sharded Pub/Sub with redis-py: standalone, cluster (sync and asyncio), Lua SPUBLISH, slot moves."""

import asyncio
import time

import redis
import redis.asyncio.cluster as acluster
from redis.cluster import RedisCluster
from redis.crc import key_slot

from simplebroker_redis.devserver import DevCluster, DevServer

CH = "sb:{ns}:wake:q"
SPUBLISH = "return redis.call('SPUBLISH', ARGV[1], ARGV[2])"


def drain(get, seconds: float = 1.0) -> list:
    """Collect messages (type, channel, data) for up to ``seconds``."""
    out, deadline = [], time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            msg = get()
        except redis.RedisError as exc:
            out.append(f"raised {type(exc).__name__}: {exc}")
            continue
        if msg:
            out.append((msg["type"], msg["channel"], msg["data"]))
    return out


with DevServer() as s:
    r = redis.Redis(port=s.port, decode_responses=True)
    print("server:", r.info("server").get("valkey_version") or r.info("server")["redis_version"])
    p = r.pubsub()
    p.ssubscribe(CH)
    print("standalone spublish ->", r.spublish(CH, "hi"))
    print("standalone Lua SPUBLISH ->", r.eval(SPUBLISH, 1, "sb:{ns}:meta", CH, "from-lua"))
    print("standalone Lua SPUBLISH, no keys ->", r.eval(SPUBLISH, 0, CH, "no-keys"))
    print("standalone subscriber got:", drain(lambda: p.get_message(timeout=0.1), 0.5))
    p.close()

with DevCluster(3) as c:
    rc = RedisCluster(host="127.0.0.1", port=c.nodes[0].port, decode_responses=True)
    slot = key_slot(CH.encode())
    owner = c.node_for_slot(slot)
    other = next(p for p in c.primaries() if p is not owner)

    sp = rc.pubsub()
    sp.ssubscribe(CH)
    print("cluster spublish ->", rc.spublish(CH, "hi"))
    print("cluster Lua SPUBLISH, channel in the keys' slot ->",
          rc.eval(SPUBLISH, 1, "sb:{ns}:meta", CH, "from-lua"))
    try:
        rc.eval(SPUBLISH, 1, "sb:{other}:meta", CH, "wrong-slot")
    except redis.RedisError as exc:
        print("cluster Lua SPUBLISH, channel in another slot ->", type(exc).__name__, str(exc)[:90])
    print("sync ClusterPubSub got:", drain(lambda: sp.get_sharded_message(timeout=0.1), 0.5))

    # A plain PubSub on the owning node (what an asyncio client can always do).
    plain = redis.Redis(port=owner.port, decode_responses=True).pubsub()
    plain.ssubscribe(CH)
    drain(lambda: plain.get_message(timeout=0.1), 0.3)
    try:
        wrong = redis.Redis(port=other.port, decode_responses=True).pubsub()
        wrong.ssubscribe(CH)
        print("SSUBSCRIBE on a node not owning the slot:", wrong.get_message(timeout=1))
    except redis.RedisError as exc:
        print("SSUBSCRIBE on a node not owning the slot:", type(exc).__name__, exc)

    async def async_subscriber() -> tuple:
        arc = acluster.RedisCluster(host="127.0.0.1", port=c.nodes[0].port, decode_responses=True)
        await arc.initialize()
        ap = arc.pubsub()
        await ap.ssubscribe(CH)
        return arc, ap

    loop = asyncio.new_event_loop()
    arc, ap = loop.run_until_complete(async_subscriber())

    async def adrain(seconds: float) -> list:
        out, deadline = [], time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                msg = await ap.get_sharded_message(timeout=0.1)
            except redis.RedisError as exc:
                out.append(f"raised {type(exc).__name__}: {exc}")
                continue
            if msg:
                out.append((msg["type"], msg["channel"], msg["data"]))
        return out

    print("async ClusterPubSub subscribed:", loop.run_until_complete(adrain(0.3)))

    c.migrate_slot(slot, other)
    print(f"--- slot {slot} moved {owner.port} -> {other.port}")
    print("plain PubSub on the old owner got:", drain(lambda: plain.get_message(timeout=0.1), 0.5))
    publisher = RedisCluster(host="127.0.0.1", port=c.nodes[0].port, decode_responses=True)
    print("spublish through a fresh client ->", publisher.spublish(CH, "after-move"))
    print("sync ClusterPubSub got:", drain(lambda: sp.get_sharded_message(timeout=0.1), 1.0))
    print("async ClusterPubSub got:", loop.run_until_complete(adrain(1.0)))

    print("--- the subscribers' own cluster clients now hit MOVED once:")
    rc.get("sb:{ns}:meta")
    loop.run_until_complete(arc.get("sb:{ns}:meta"))
    loop.run_until_complete(asyncio.sleep(0.5))
    print("spublish ->", publisher.spublish(CH, "after-refresh"))
    print("sync ClusterPubSub got:", drain(lambda: sp.get_sharded_message(timeout=0.1), 1.0))
    print("async ClusterPubSub got:", loop.run_until_complete(adrain(1.0)))
    print("spublish ->", publisher.spublish(CH, "once-more"))
    print("sync ClusterPubSub got:", drain(lambda: sp.get_sharded_message(timeout=0.1), 1.0))
    print("async ClusterPubSub got:", loop.run_until_complete(adrain(1.0)))
    loop.run_until_complete(ap.aclose())
    loop.run_until_complete(arc.aclose())
    loop.close()
