"""WAIT in cluster mode: where RedisCluster sends it, and EVALSHA + WAIT in one round trip.

3 primaries with one replica each. WAIT counts replicas that acknowledged the
writes *of the connection it runs on*, so it must share the write's connection.
The replica of the key's primary is frozen (SIGSTOP) to make that visible.
"""

import asyncio
import os
import signal
import time

import redis
import redis.asyncio
import redis.asyncio.cluster as acluster
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.crc import key_slot
from redis.retry import Retry

from _dropproxy import DropProxy
from simplebroker_redis.devserver import DevCluster

KEY = "{w}:n"
INCR = "return redis.call('INCR', KEYS[1])"


def show(label: str, call) -> None:
    start = time.monotonic()
    try:
        outcome = repr(call())
    except (redis.RedisError, redis.exceptions.RedisClusterException) as exc:
        outcome = f"{type(exc).__name__}: {exc}"[:100]
    print(f"{label:62} -> {outcome} ({time.monotonic() - start:.2f} s)")


with DevCluster(3, 1) as c:
    owner = c.node_for_key(KEY)
    (replica,) = c.replicas_of(owner)
    rc = RedisCluster(host="127.0.0.1", port=owner.port, retry=Retry(NoBackoff(), 0))
    sha = rc.script_load(INCR)
    node = rc.get_node_from_key(KEY)
    rc.set_default_node(next(n for n in rc.get_primaries() if n != node))
    print("default node is the key's node:", rc.get_default_node() == node)
    os.kill(replica.process.pid, signal.SIGSTOP)
    try:
        rc.set(KEY, 0)
        show("rc.wait(1, 300) after rc.set (routed to the default node)", lambda: rc.wait(1, 300))
        show("rc.wait(1, 300, target_nodes=key node)", lambda: rc.wait(1, 300, target_nodes=node))

        show("ClusterPipeline.evalsha()", lambda: rc.pipeline().evalsha(sha, 1, KEY))
        pipe = rc.pipeline()
        pipe.execute_command("EVALSHA", sha, 1, KEY)
        pipe.wait(1, 300)
        show("ClusterPipeline [execute_command EVALSHA, WAIT]", pipe.execute)
        pipe = rc.pipeline()
        pipe.execute_command("EVALSHA", sha, 1, KEY)
        pipe.execute_command("WAIT", 1, 300, target_nodes=node)
        show("ClusterPipeline [EVALSHA, WAIT target_nodes=node]", pipe.execute)

        node_client = rc.get_redis_connection(node)  # the plain Redis the cluster client uses
        print("node client retries:", node_client.get_retry().get_retries())
        pipe = node_client.pipeline(transaction=False)
        pipe.evalsha(sha, 1, KEY)
        pipe.wait(1, 300)
        show("node Redis pipeline [EVALSHA, WAIT] (frozen replica)", pipe.execute)
    finally:
        os.kill(replica.process.pid, signal.SIGCONT)
    pipe = node_client.pipeline(transaction=False)
    pipe.evalsha(sha, 1, KEY)
    pipe.wait(1, 1000)
    show("node Redis pipeline [EVALSHA, WAIT] (replica running)", pipe.execute)

    # After the slot moved, the node pipeline gets MOVED for EVALSHA (not run) and
    # WAIT still answers; the caller must refresh the map and resend.
    other = next(p for p in c.primaries() if p is not owner)
    c.migrate_slot(key_slot(KEY.encode()), other)
    pipe = node_client.pipeline(transaction=False)
    pipe.evalsha(sha, 1, KEY)
    pipe.wait(0, 0)
    show("node pipeline after the slot moved (raise_on_error=False)", lambda: pipe.execute(raise_on_error=False))
    rc.close()

    async def amain() -> None:
        arc = acluster.RedisCluster(host="127.0.0.1", port=owner.port, retry=Retry(NoBackoff(), 0))
        await arc.initialize()
        anode = arc.get_node_from_key(KEY)
        arc.set_default_node(next(n for n in arc.get_primaries() if n != anode))
        print("async default node is the key's node:", arc.get_default_node() == anode)
        (frozen,) = c.replicas_of(c.node_for_key(KEY))  # the slot moved above
        os.kill(frozen.process.pid, signal.SIGSTOP)  # a correct WAIT 1 now answers 0
        for label, wait_kwargs in [("", {}), (" target_nodes=node", {"target_nodes": anode})]:
            pipe = arc.pipeline()
            pipe.execute_command("EVALSHA", sha, 1, KEY)  # .evalsha() is blocked here too
            pipe.execute_command("WAIT", 1, 300, **wait_kwargs)
            start = time.monotonic()
            try:
                outcome = repr(await pipe.execute())
            except (redis.RedisError, redis.exceptions.RedisClusterException) as exc:
                outcome = f"{type(exc).__name__}: {exc}"[:100]
            print(f"async ClusterPipeline [EVALSHA, WAIT{label}]: {outcome} ({time.monotonic() - start:.2f} s)")
        plain = redis.asyncio.Redis(host=anode.host, port=anode.port, retry=Retry(NoBackoff(), 0))
        p = plain.pipeline(transaction=False)
        p.evalsha(sha, 1, KEY)
        p.wait(1, 300)
        print("async plain Redis to the key's node [EVALSHA, WAIT]:", await p.execute())
        os.kill(frozen.process.pid, signal.SIGCONT)
        await plain.aclose()
        await arc.aclose()

    asyncio.run(amain())

# A lost pipeline reply, ClusterPipeline with retry=0: are the commands re-sent?
with DevCluster(3) as c:
    proxies = {n.port: DropProxy(n.port) for n in c.nodes}
    owner = c.node_for_key(KEY)
    rc = RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", proxies[owner.port].port)],
                      address_remap=lambda a: ("127.0.0.1", proxies[a[1]].port),
                      retry=Retry(NoBackoff(), 0))
    sha = rc.script_load(INCR)
    rc.set(KEY, 0)
    # The sync ClusterPipeline finds an EVALSHA's keys with COMMAND GETKEYS on the
    # default node (one more round trip, carrying every argument): keep that
    # request away from the armed proxy.
    default = next(n for n in rc.get_primaries() if n != rc.get_node_from_key(KEY))
    rc.set_default_node(default)
    getkeys = lambda: sum(int(n.call("INFO", "commandstats").get("cmdstat_command|getkeys", {}).get("calls", 0)) for n in c.nodes)
    before = getkeys()
    proxies[owner.port].armed = 1
    pipe = rc.pipeline()
    pipe.execute_command("EVALSHA", sha, 1, KEY, "lost-reply")
    show("ClusterPipeline(retry=0) [EVALSHA] with its reply lost", pipe.execute)
    print("   counter:", owner.call("GET", KEY), "  COMMAND GETKEYS sent:", getkeys() - before)
    node_client = rc.get_redis_connection(rc.get_node_from_key(KEY))
    proxies[owner.port].armed = 1
    pipe = node_client.pipeline(transaction=False)
    pipe.evalsha(sha, 1, KEY, "lost-reply")
    show("node Redis pipeline [EVALSHA] with its reply lost", pipe.execute)
    print("   counter:", owner.call("GET", KEY))

    async def alost() -> None:
        arc = acluster.RedisCluster(
            startup_nodes=[acluster.ClusterNode("127.0.0.1", proxies[owner.port].port)],
            address_remap=lambda a: ("127.0.0.1", proxies[a[1]].port), retry=Retry(NoBackoff(), 0))
        await arc.initialize()
        anode = arc.get_node_from_key(KEY)
        arc.set_default_node(next(n for n in arc.get_primaries() if n != anode))
        before = getkeys()
        proxies[owner.port].armed = 1
        pipe = arc.pipeline()
        pipe.execute_command("EVALSHA", sha, 1, KEY, "lost-reply")
        try:
            outcome = repr(await pipe.execute())
        except redis.RedisError as exc:
            outcome = f"{type(exc).__name__}: {exc}"
        print(f"{'async ClusterPipeline(retry=0) [EVALSHA] with its reply lost':62} -> {outcome}")
        print("   counter:", owner.call("GET", KEY), "  COMMAND GETKEYS sent:", getkeys() - before)
        await arc.aclose()

    asyncio.run(alost())
