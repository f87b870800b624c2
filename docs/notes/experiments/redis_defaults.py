"""redis-py 8 client defaults: protocol, retries, timeouts; a wrong password is retried."""

import time

import redis

from simplebroker_redis.devserver import DevServer

client = redis.Redis()
kwargs = client.connection_pool.connection_kwargs
print("redis-py", redis.__version__, "| protocol kwarg:", kwargs.get("protocol"),
      "| retries:", client.get_retry().get_retries(),
      "| socket_timeout:", kwargs.get("socket_timeout"),
      "| socket_connect_timeout:", kwargs.get("socket_connect_timeout"))

with DevServer(extra_args=["--requirepass", "secret"]) as server:
    hello = redis.Redis(port=server.port, password="secret")
    print("protocol of a default client (CLIENT INFO resp=):", hello.client_info().get("resp"))
    start = time.monotonic()
    try:
        redis.Redis(port=server.port).ping()
    except redis.AuthenticationError as exc:
        print(f"ping() without password: {type(exc).__name__} after {time.monotonic() - start:.1f} s")
