"""The nemesis suite's fault proxy does what its faults promise, on a real server."""

from __future__ import annotations

import time

import pytest
import redis

from simplebroker_redis.devserver import DevServer
from support.faultproxy import FaultProxy


@pytest.fixture
def proxy(server: DevServer) -> FaultProxy:
    with FaultProxy(("127.0.0.1", server.port)) as p:
        yield p


def client(proxy: FaultProxy, timeout: float = 1.0) -> redis.Redis:
    return redis.Redis.from_url(
        proxy.url(), socket_timeout=timeout, socket_connect_timeout=timeout, retry=None
    )


def test_forwards_until_a_blackhole_then_delivers_what_was_held(proxy: FaultProxy) -> None:
    c = client(proxy)
    assert c.ping()
    proxy.blackhole()
    with pytest.raises(redis.TimeoutError):
        c.ping()  # no RST: the client waits until its own timeout
    assert proxy.connections >= 1  # nothing was closed
    proxy.heal()
    late = client(proxy, timeout=5)
    assert late.ping()
    c.close()
    late.close()


def test_a_one_way_blackhole_holds_replies_only(proxy: FaultProxy, server: DevServer) -> None:
    c = client(proxy)
    key = f"proxy-oneway-{time.monotonic_ns()}"
    assert c.ping()  # connected (and its handshake answered) before the fault
    proxy.blackhole("to_client")
    with pytest.raises(redis.TimeoutError):
        c.set(key, "1")
    direct = redis.Redis(port=server.port)
    assert direct.get(key) == b"1"  # the request reached the server; its reply did not
    direct.delete(key)
    direct.close()
    c.close()


def test_reset_closes_every_connection_and_refuses_until_healed(proxy: FaultProxy) -> None:
    c = client(proxy)
    assert c.ping()
    proxy.reset(refuse=True)
    with pytest.raises(redis.ConnectionError):
        c.ping()
    with pytest.raises(redis.ConnectionError):
        client(proxy).ping()
    proxy.heal()
    assert client(proxy).ping()
    c.close()


def test_latency_delays_every_reply(proxy: FaultProxy) -> None:
    c = client(proxy, timeout=5)
    assert c.ping()
    proxy.latency(0.3)
    start = time.monotonic()
    c.ping()
    assert time.monotonic() - start >= 0.5  # held once each way
    proxy.heal()
    c.close()


def test_latency_delays_chunks_without_slowing_the_link(proxy: FaultProxy) -> None:
    """A delay line: replies sent one after another arrive one delay later, not one each."""
    c = client(proxy, timeout=10)
    assert c.ping()
    proxy.latency(0.3)
    start = time.monotonic()
    for _ in range(8):  # eight round trips: about 8 x 0.6 s, whatever chunks they make
        c.ping()
    sequential = time.monotonic() - start
    pipe = c.pipeline(transaction=False)
    for n in range(2000):  # many chunks each way, all in flight at once
        pipe.echo(f"chunk-{n:04d}-" + "x" * 200)
    start = time.monotonic()
    replies = pipe.execute()
    pipelined = time.monotonic() - start
    proxy.heal()
    assert replies[-1] == b"chunk-1999-" + b"x" * 200
    assert sequential >= 8 * 0.6
    assert pipelined < 3.0  # one delay each way (plus load), not one per chunk
    c.close()
