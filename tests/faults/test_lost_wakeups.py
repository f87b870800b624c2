"""Wake-ups must not be lost: a waiter is live when it is handed out.

Found while writing the ACL and TLS tests: once a process's Pub/Sub listener
is connected, a new waiter's SUBSCRIBE is sent but not confirmed before the
waiter is returned, so a write made right after creating the waiter (on the
command connection, which the server may serve first) publishes to nobody.
"""

from __future__ import annotations

import threading

from simplebroker_redis import RedisRunner, redis_backend_plugin
from simplebroker_redis.core import RedisBrokerCore


def test_waiter_created_on_a_connected_listener_sees_the_next_write(make_server):
    # A private server: the listener thread outlives the test, and its idle
    # PINGs must not show up in other tests' command counts.
    server = make_server("wakeups")
    redis_url, options = server.url, {"namespace": "wakeups"}
    broker = RedisBrokerCore(RedisRunner(redis_url, namespace="wakeups"), owns_runner=True)
    first = redis_backend_plugin.create_activity_waiter(
        target=redis_url, backend_options=options, queue_name="first", stop_event=threading.Event()
    )
    missed = []
    try:
        for i in range(20):
            waiter = redis_backend_plugin.create_activity_waiter(
                target=redis_url,
                backend_options=options,
                queue_name=f"q{i}",
                stop_event=threading.Event(),
            )
            broker.write(f"q{i}", "x")
            if not waiter.wait(1):
                missed.append(i)
            waiter.close()
            if len(missed) == 3:
                break  # enough to show it; each miss costs a full wait
    finally:
        first.close()
        broker.shutdown()
    assert not missed, f"wake-ups of waiters {missed} were published before they subscribed"
