"""kombu 5.7's integration test classes, bound to the transport under test.

The classes of ``t/integration/common.py`` run unchanged, bound as kombu's
``test_redis.py`` binds them (plus ``BaseTimeToLive`` and ``BaseFailover``,
which ``test_py_amqp.py`` binds); the priority tests are
``test_redis.test_RedisPriority`` itself (Redis order: 0 first), run on our
transport with ``priority_order = "redis"``.

``test_redis.py``'s module-level tests hard-code ``redis://`` URLs or read
the Redis transport's own keys (``unacked``); the ones whose contract any
transport can meet are written here again for the transport under test,
with the same steps and the same assertions on what a client sees:
wrong credentials, a connect timeout, a TLS hostname check, and a
requeued or unacknowledged message coming back at once, marked
redelivered.
"""

from __future__ import annotations

from contextlib import closing
from typing import Any
from uuid import uuid4

import kombu
import pytest
import redis
from t.integration import common
from t.integration import test_redis as stock

from conftest import DEAD_PORT, TRANSPORT, options, url


class test_BasicFunctionality(common.BasicFunctionality):
    def test_failed_connection__ConnectionError(self, invalid_connection):
        with pytest.raises(redis.exceptions.ConnectionError) as raised:
            _ = invalid_connection.connection
        assert raised.type in invalid_connection.transport.connection_errors


class test_ExchangeTypes(common.BaseExchangeTypes):
    pass


class test_TimeToLive(common.BaseTimeToLive):
    pass


class test_Priority(stock.test_RedisPriority):
    """kombu's Redis priority tests: priority 0 is read first."""

    @pytest.fixture
    def transport_options(self) -> dict[str, Any]:
        return options(priority_order="redis")


class test_Message(common.BaseMessage):
    pass


class test_EventLoop(common.BaseEventLoop):
    pass


class test_Failover(common.BaseFailover):
    pass


def _published(channel: Any, queue: kombu.Queue, payload: dict[str, str]) -> Any:
    bound = queue(channel)
    bound.declare()
    kombu.Producer(channel).publish(
        payload, exchange=queue.exchange, routing_key=queue.routing_key, serializer="json"
    )
    return bound


def _hold_one(transport_options: dict[str, Any]) -> dict[str, Any]:
    """Options under which only an explicit hand-back can return a held message in time."""
    if TRANSPORT == "redis":
        return {**transport_options, "visibility_timeout": 3600}
    return transport_options  # a lease is renewed while its holder lives


def test_failed_credentials():
    with pytest.raises(redis.exceptions.AuthenticationError):
        kombu.Connection(
            url(user="wrong_redis_user", password="wrong_redis_password"),
            transport_options=options(),
        ).connect()


def test_connect_timeout(monkeypatch):
    def connect_timeout(self):
        raise TimeoutError

    monkeypatch.setattr(redis.connection.Connection, "_connect", connect_timeout)
    with pytest.raises(redis.exceptions.TimeoutError):
        kombu.Connection(url(DEAD_PORT), transport_options=options()).connect()


def test_check_hostname(monkeypatch):
    def connect(self):
        if self.check_hostname:
            raise OSError("check_hostname=True")
        raise TimeoutError("check_hostname=False")

    monkeypatch.setattr(redis.connection.SSLConnection, "_connect", connect)
    tls = url(DEAD_PORT, tls=True)
    with pytest.raises(redis.exceptions.TimeoutError):
        kombu.Connection(f"{tls}?ssl_check_hostname=false", transport_options=options()).connect()
    with pytest.raises(redis.exceptions.ConnectionError):
        kombu.Connection(f"{tls}?ssl_check_hostname=true", transport_options=options()).connect()


def test_requeue_requeues_message(transport_options):
    name = f"requeue_{uuid4().hex}"
    queue = kombu.Queue(name, exchange=kombu.Exchange(name, type="direct"), routing_key=name)
    payload = {"msg": "requeue me"}
    with kombu.Connection(url(), transport_options=_hold_one(transport_options)) as conn:
        with conn.channel() as channel:
            bound = _published(channel, queue, payload)
            message = bound.get(no_ack=False)
            assert message.payload == payload
            message.requeue()
            again = bound.get(no_ack=True)
            assert again is not None and again.payload == payload
            assert again.headers["redelivered"] is True
            assert bound.get(no_ack=True) is None  # requeued once


def test_unacked_message_requeued_on_connection_close(transport_options):
    name = f"restore_at_close_{uuid4().hex}"
    queue = kombu.Queue(name, routing_key=name)
    payload = {"msg": "held while the consumer shuts down"}
    held = _hold_one(transport_options)
    with kombu.Connection(url(), transport_options=held) as conn:
        with conn.channel() as channel:
            bound = _published(channel, queue, payload)
            assert bound.get(no_ack=False).payload == payload
    with kombu.Connection(url(), transport_options=held) as conn:
        with closing(conn.channel()) as channel:
            bound = queue(channel)
            again = bound.get(no_ack=True)
            assert again is not None and again.payload == payload
            assert again.headers["redelivered"] is True
            assert bound.get(no_ack=True) is None
