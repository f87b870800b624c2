"""Where RedisCluster (sync and asyncio) sends EVALSHA / Script calls, and NOSCRIPT recovery.

Run: .venv/bin/python docs/notes/experiments/cluster_scripts.py
(SIMPLEBROKER_REDIS_SERVER=/usr/bin/redis-server for Redis 7.0).
"""

import asyncio

import redis
import redis.asyncio.cluster as acluster
from redis.cluster import ClusterNode, RedisCluster

from simplebroker_redis.devserver import DevCluster

LUA = "redis.call('INCR', KEYS[1]); return redis.call('GET', KEYS[2])"


def evalsha_calls(node) -> int:
    """Return how many EVALSHA this node executed (INFO commandstats)."""
    stats = node.call("INFO", "commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


def script_exists(node, sha: str) -> bool:
    return bool(node.call("SCRIPT", "EXISTS", sha)[0])


with DevCluster(3, 1) as c:
    rc = RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", c.nodes[0].port)], decode_responses=True)
    script = rc.register_script(LUA)
    keys = ["{ns}:a", "{ns}:b"]
    owner = c.node_for_key("{ns}")
    rc.set("{ns}:b", "hello")
    before = {n.port: evalsha_calls(n) for n in c.nodes}
    print("script():", script(keys=keys))
    after = {n.port: evalsha_calls(n) for n in c.nodes}
    print("EVALSHA ran on:", [p for p in after if after[p] != before[p]], "owner:", owner.port)
    print("loaded on primaries:", {n.port: script_exists(n, script.sha) for n in c.primaries()})
    print("on replicas:", {n.port: script_exists(n, script.sha) for n in c.nodes if n not in c.primaries()})

    # NOSCRIPT on the owning node only: Script reloads (SCRIPT LOAD goes to every primary).
    owner.call("SCRIPT", "FLUSH")
    print("after FLUSH on owner, exists there:", script_exists(owner, script.sha))
    print("script() again:", script(keys=keys), "exists on owner now:", script_exists(owner, script.sha))

    # Raw evalsha after a flush: NoScriptError surfaces (no automatic load).
    owner.call("SCRIPT", "FLUSH")
    try:
        rc.evalsha(script.sha, 2, *keys)
    except redis.exceptions.NoScriptError as exc:
        print("raw evalsha after FLUSH:", type(exc).__name__, exc)

    # Keys in two slots: refused by the client before anything is sent.
    try:
        script(keys=["{a}:x", "{b}:y"])
    except redis.exceptions.RedisClusterException as exc:
        print("two slots:", type(exc).__name__, exc)

    async def main() -> None:
        arc = acluster.RedisCluster(host="127.0.0.1", port=c.nodes[0].port, decode_responses=True)
        ascript = arc.register_script(LUA)
        owner.call("SCRIPT", "FLUSH")
        print("async script() after FLUSH:", await ascript(keys=keys),
              "exists on owner:", script_exists(owner, ascript.sha))
        try:
            await ascript(keys=["{a}:x", "{b}:y"])
        except redis.exceptions.RedisClusterException as exc:
            print("async two slots:", type(exc).__name__, exc)
        await arc.aclose()

    asyncio.run(main())

    # After a failover the promoted replica has no scripts (SCRIPT LOAD is not replicated).
    print("script() before failover:", script(keys=keys))
    (heir,) = c.replicas_of(owner)
    c.kill(owner)
    print("promoted replica has the script:", script_exists(heir, script.sha))
    print("script() after failover:", script(keys=keys), "now loaded there:", script_exists(heir, script.sha))
    rc.close()
