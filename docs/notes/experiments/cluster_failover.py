"""What a RedisCluster client (retries off) sees while a primary dies and its replica takes over."""

import os
import signal
import threading
import time

import redis
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry

from simplebroker_redis.devserver import DevCluster

KEY = "{f}:n"

with DevCluster(3, 1) as c:
    rc = RedisCluster(host="127.0.0.1", port=c.nodes[1].port, retry=Retry(NoBackoff(), 0),
                      socket_timeout=1, socket_connect_timeout=1)
    script = rc.register_script("return redis.call('INCR', KEYS[1])")
    script(keys=[KEY])
    victim = c.node_for_key(KEY)
    (replica,) = c.replicas_of(victim)
    outcomes: list[tuple[float, str]] = []
    stop = threading.Event()

    def hammer() -> None:
        while not stop.is_set():
            t = time.monotonic() - start
            try:
                script(keys=[KEY])
                outcomes.append((t, "ok"))
            except (redis.RedisError, redis.exceptions.RedisClusterException) as exc:
                outcomes.append((t, f"{type(exc).__name__}: {str(exc)[:60]}"))
            time.sleep(0.05)

    start = time.monotonic()
    worker = threading.Thread(target=hammer)
    worker.start()
    time.sleep(0.3)
    os.kill(victim.process.pid, signal.SIGKILL)
    victim.process.wait()
    victim.process = None
    killed = time.monotonic() - start
    c.wait_stable()  # the replica has taken over and every node agrees
    settled = time.monotonic() - start
    time.sleep(0.5)
    stop.set()
    worker.join()
    print(f"killed at {killed:.2f} s, cluster settled at {settled:.2f} s")
    last = None
    for t, what in outcomes:  # print each change of outcome once
        if what != last:
            print(f"  {t:6.2f} s  {what}")
            last = what
    print("counter on the promoted replica:", replica.call("GET", KEY),
          "successful calls:", sum(1 for _, w in outcomes if w == "ok") + 1)
