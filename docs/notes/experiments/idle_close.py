"""Is a pooled connection that the server closed while idle replaced at checkout?

redis-py 8 skips its checkout health check (can_read) when the pool's
maintenance notifications are enabled, which they are ("auto") by default
with RESP3, redis-py 8's default protocol.
"""

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from simplebroker_redis.devserver import DevServer

with DevServer() as server:
    admin = redis.Redis(port=server.port)
    for kwargs in ({}, {"protocol": 2}, {"protocol": 3, "maint_notifications_config": None}):
        client = redis.Redis(port=server.port, retry=Retry(NoBackoff(), 0), **kwargs)
        client.set("k", 1)
        client_id = client.client_id()
        admin.client_kill_filter(_id=client_id)  # the server closes the idle pooled connection
        label = f"{kwargs or 'defaults'} maint={client.connection_pool.maint_notifications_enabled()!r}"
        try:
            client.set("k", 2)
            print(f"{label:70} -> next command OK (stale connection replaced at checkout)")
        except redis.ConnectionError as exc:
            print(f"{label:70} -> {type(exc).__name__}: {exc}")
        client.close()
