"""MOVED, ASK, TRYAGAIN and CLUSTERDOWN as redis-py's RedisCluster sees them.

Every client here has retries off (retry=Retry(NoBackoff(), 0)), the setting
a write path needs (see lost_reply.py), so what is left is redis-py's own
redirect handling.
"""

import time

import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.crc import key_slot
from redis.exceptions import RedisClusterException
from redis.retry import Retry

from simplebroker_redis.devserver import DevCluster

TWO_KEYS = "redis.call('INCR', KEYS[1]); redis.call('INCR', KEYS[2]); return 'ran'"


def client(cluster: DevCluster, **kwargs) -> RedisCluster:
    kwargs.setdefault("retry", Retry(NoBackoff(), 0))
    return RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", cluster.nodes[0].port)],
                        decode_responses=True, **kwargs)


def attempt(label: str, call) -> None:
    start = time.monotonic()
    try:
        outcome = f"-> {call()!r}"
    except (redis.RedisError, RedisClusterException) as exc:
        outcome = f"-> {type(exc).__name__}: {exc}"
    print(f"{label:58} {outcome} ({time.monotonic() - start:.2f} s)")


with DevCluster(3) as c:
    rc = client(c)
    script = rc.register_script(TWO_KEYS)
    slot = key_slot(b"m")
    source = c.node_for_slot(slot)
    target = next(p for p in c.primaries() if p is not source)
    rc.mset({"{m}:a": 0, "{m}:b": 0})

    c.migrate_slot(slot, target)  # the client still believes in `source`
    attempt("after a finished migration (client map stale: MOVED)", lambda: script(keys=["{m}:a", "{m}:b"]))
    c.migrate_slot(slot, source)
    attempt("and back", lambda: script(keys=["{m}:a", "{m}:b"]))

    # A migration in progress: IMPORTING/MIGRATING set, only {m}:a moved so far.
    target.call("CLUSTER", "SETSLOT", slot, "IMPORTING", source.node_id)
    source.call("CLUSTER", "SETSLOT", slot, "MIGRATING", target.node_id)
    attempt("mid-migration, both keys still on source", lambda: script(keys=["{m}:a", "{m}:b"]))
    attempt("mid-migration, one key missing on source", lambda: script(keys=["{m}:a", "{m}:new"]))
    attempt("mid-migration, both keys missing (ASK to target)", lambda: script(keys=["{m}:x", "{m}:y"]))
    source.call("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", "{m}:a")
    attempt("mid-migration, keys split between nodes", lambda: script(keys=["{m}:a", "{m}:b"]))
    attempt("mid-migration, single key moved (ASK)", lambda: rc.incr("{m}:a"))
    for key in source.call("CLUSTER", "GETKEYSINSLOT", slot, 100):
        source.call("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", key)
    for node in (target, source, *[p for p in c.primaries() if p not in (source, target)]):
        node.call("CLUSTER", "SETSLOT", slot, "NODE", target.node_id)
    c.wait_stable()
    attempt("migration finished", lambda: script(keys=["{m}:a", "{m}:b"]))
    rc.close()

with DevCluster(3) as c:  # no replicas: a dead primary takes the cluster down
    live_key = next(f"k{i}" for i in range(100) if c.node_for_key(f"k{i}") is c.nodes[1])
    dead_key = next(f"k{i}" for i in range(100) if c.node_for_key(f"k{i}") is c.nodes[0])
    no_retry = client(c)
    default = client(c, retry=None)  # redis-py's default: 10 retries
    c.kill(c.nodes[0])  # returns once every other node flags it fail (cluster_state:fail)
    attempt("cluster down, live slot, retry 0", lambda: no_retry.get(live_key))
    attempt("cluster down, live slot, default retry", lambda: default.get(live_key))
    attempt("cluster down, dead slot, retry 0", lambda: no_retry.get(dead_key))
    attempt("cluster down, dead slot, default retry", lambda: default.get(dead_key))
