"""WAIT and WAITAOF: replies, per-connection meaning, MULTI, Lua, pipelining after EVALSHA.

A primary with one replica; the replica is frozen with SIGSTOP where a test
needs acknowledgements to stop.
"""

import os
import signal
import time

import redis

from simplebroker_redis.devserver import DevServer


def show(label: str, call) -> None:
    start = time.monotonic()
    try:
        outcome = repr(call())
    except redis.RedisError as exc:
        outcome = f"{type(exc).__name__}: {exc}"[:110]
    print(f"{label:52} -> {outcome} ({time.monotonic() - start:.2f} s)")


with DevServer(appendonly=True) as primary, DevServer() as replica:
    replica_client = redis.Redis(port=replica.port)
    replica_client.replicaof("127.0.0.1", primary.port)
    a = redis.Redis(port=primary.port, single_connection_client=True, protocol=2)
    b = redis.Redis(port=primary.port, single_connection_client=True, protocol=2)
    while a.info("replication")["connected_slaves"] < 1 or replica_client.info("replication")["master_link_status"] != "up":
        time.sleep(0.05)
    print("server:", a.info("server").get("valkey_version") or a.info("server")["redis_version"])
    a.set("k", 1)
    show("WAIT 1 1000 after a write", lambda: a.wait(1, 1000))
    show("WAITAOF 1 1 1000 (primary has appendonly yes)", lambda: a.waitaof(1, 1, 1000))
    show("WAITAOF 0 1 1000 (replica has appendonly no)", lambda: a.waitaof(0, 1, 1000))
    show("WAITAOF 1 0 0", lambda: a.waitaof(1, 0, 0))
    show("WAITAOF on the replica (numlocal 1, no AOF)", lambda: replica_client.waitaof(1, 0, 100))

    os.kill(replica.process.pid, signal.SIGSTOP)
    try:
        a.set("k", 2)
        show("replica frozen: WAIT 1 300 on the writing conn", lambda: a.wait(1, 300))
        show("replica frozen: WAIT 1 300 on another conn", lambda: b.wait(1, 300))
        show("replica frozen: WAIT 0 0", lambda: a.wait(0, 0))
        sha = a.script_load("return redis.call('INCR', KEYS[1])")
        pipe = a.pipeline(transaction=False)
        pipe.evalsha(sha, 1, "n")
        pipe.wait(1, 300)
        show("pipeline [EVALSHA, WAIT 1 300] (one round trip)", pipe.execute)
        tx = a.pipeline(transaction=True)
        tx.incr("n")
        tx.wait(1, 300)
        show("MULTI / INCR / WAIT 1 300 / EXEC", tx.execute)
        tx = a.pipeline(transaction=True)
        tx.incr("n")
        tx.waitaof(1, 0, 300)
        show("MULTI / INCR / WAITAOF 1 0 300 / EXEC", tx.execute)
        show("WAIT inside a Lua script", lambda: a.eval("return redis.call('WAIT', 1, 100)", 0))
        show("WAITAOF inside a Lua script", lambda: a.eval("return redis.call('WAITAOF', 1, 0, 100)", 0))
    finally:
        os.kill(replica.process.pid, signal.SIGCONT)
    show("replica thawed: WAIT 1 1000", lambda: a.wait(1, 1000))
