"""Subscriptions notice a silent network (a half-open connection), on both listeners.

A subscribed connection has no read timeout: it idles between wake-ups. A
network that goes silent without closing anything (a blackhole, a NAT
that forgot the flow) would leave it deaf until TCP gave up. Each listener
PINGs after ``PING_INTERVAL`` s of silence and gives the connection up
when the PING stays unanswered ``PING_TIMEOUT`` s, then reconnects; once
the network heals, a write wakes the waiter again within seconds.
"""

from __future__ import annotations

import threading

import pytest

from simplebroker_redis import AsyncRedisRunner, RedisRunner
from simplebroker_redis.activity import AsyncActivity, open_waiter
from simplebroker_redis.activity.outage import PING_INTERVAL, PING_TIMEOUT
from simplebroker_redis.core import RedisBrokerCore
from simplebroker_redis.devserver import DevServer
from support.faultproxy import FaultProxy
from support.waiting import eventually, wait_for

#: Longest a silent subscription may go unnoticed (plus the 1 s poll slices).
NOTICED_WITHIN = PING_INTERVAL + PING_TIMEOUT + 3


@pytest.fixture
def proxy(server: DevServer) -> FaultProxy:
    with FaultProxy(("127.0.0.1", server.port)) as p:
        yield p


def test_the_thread_listener_reconnects_when_its_ping_goes_unanswered(
    proxy: FaultProxy, server: DevServer, namespace: str
) -> None:
    runner = RedisRunner(proxy.url(), namespace=namespace)
    direct = RedisRunner(server.url, namespace=namespace)
    stop = threading.Event()
    waiter = open_waiter(runner, ["jobs"], stop)
    try:
        before = proxy.accepted
        proxy.blackhole()
        wait_for(lambda: proxy.accepted > before, NOTICED_WITHIN, "a reconnect", interval=0.1)
        proxy.heal()
        while waiter.wait(0.5):
            pass  # the wake-up every reconnect gives: consumed
        RedisBrokerCore(direct).write("jobs", "after the heal")
        assert waiter.wait(5.0), "the write did not wake the waiter"
    finally:
        proxy.heal()
        stop.set()
        waiter.close()
        runner.shutdown()
        direct.shutdown()


async def test_the_asyncio_listener_reconnects_when_its_ping_goes_unanswered(
    proxy: FaultProxy, server: DevServer, namespace: str
) -> None:
    runner = AsyncRedisRunner(proxy.url(), namespace=namespace)
    direct = RedisRunner(server.url, namespace=namespace)
    activity = AsyncActivity(runner, ["jobs"])
    try:
        await activity.start()
        await activity.wait(0)  # the wake-up every (re)subscription gives
        before = proxy.accepted
        proxy.blackhole()
        await eventually(lambda: proxy.accepted > before, NOTICED_WITHIN, interval=0.1)
        proxy.heal()
        while await activity.wait(0.5):
            pass  # the wake-up every reconnect gives: consumed
        RedisBrokerCore(direct).write("jobs", "after the heal")
        assert await activity.wait(5.0), "the write did not wake the waiter"
    finally:
        proxy.heal()
        await activity.close()
        await runner.aclose()
        direct.shutdown()
