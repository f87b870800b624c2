"""Appended to Dramatiq's ``tests/conftest.py`` in the temporary extraction.

Dramatiq's tests take their broker from fixtures (``stub_broker``,
``redis_broker``) and their result backends from others; these
redefinitions (the later definition in a module wins) give every test the
broker under test on the runner's server: Dramatiq's ``RedisBroker``
(``PEER_BROKER=redis``) or ours (``simplebroker``, a namespace of its own
per test), with the matching result backend. ``run.py`` sets the ``PEER_*``
variables.
"""

import os as _peer_os
import uuid as _peer_uuid
from collections.abc import Iterator as _PeerIterator
from typing import Any as _PeerAny

import dramatiq as _peer_dramatiq
import pytest as _peer_pytest
from dramatiq.brokers.redis import RedisBroker as _PeerRedisBroker
from dramatiq.rate_limits import backends as _peer_rl_backends
from dramatiq.results import backends as _peer_res_backends

PEER_BROKER = _peer_os.environ.get("PEER_BROKER", "simplebroker")
PEER_URL = _peer_os.environ.get("PEER_URL", "redis://127.0.0.1:6379/0")


@_peer_pytest.fixture()
def peer_namespace() -> str:
    """Return the SimpleBroker namespace of this test (ours only)."""
    return f"dq-peer-{_peer_uuid.uuid4().hex[:12]}"


def _peer_make_broker(namespace: str) -> _PeerAny:
    """Return the broker under test, set as Dramatiq's global broker."""
    broker: _PeerAny
    if PEER_BROKER == "redis":
        broker = _PeerRedisBroker(url=PEER_URL)
        broker.client.flushall()
    else:
        from dramatiq_simplebroker import SimpleBrokerDramatiqBroker

        broker = SimpleBrokerDramatiqBroker(PEER_URL, namespace=namespace)
    broker.emit_after("process_boot")
    _peer_dramatiq.set_broker(broker)
    return broker


@_peer_pytest.fixture()
def stub_broker(peer_namespace: str) -> _PeerIterator[_PeerAny]:
    """Dramatiq's stub broker fixture: here, the broker under test."""
    broker = _peer_make_broker(peer_namespace)
    yield broker
    broker.flush_all()
    broker.close()


@_peer_pytest.fixture()
def redis_broker(peer_namespace: str) -> _PeerIterator[_PeerAny]:
    """Dramatiq's RedisBroker fixture: here, the broker under test."""
    broker = _peer_make_broker(peer_namespace)
    yield broker
    if PEER_BROKER == "redis":
        broker.client.flushall()
    broker.close()


@_peer_pytest.fixture()
def stub_worker(stub_broker: _PeerAny) -> _PeerIterator[_PeerAny]:
    """Dramatiq's stub worker fixture, on the broker under test."""
    worker = _peer_dramatiq.Worker(stub_broker, worker_timeout=100, worker_threads=32)
    worker.start()
    yield worker
    worker.stop()


@_peer_pytest.fixture()
def redis_result_backend(peer_namespace: str) -> _PeerAny:
    """Return the result backend beside the broker under test (for ours: its namespace)."""
    if PEER_BROKER == "redis":
        backend = _peer_res_backends.RedisBackend(url=PEER_URL)
        backend.client.flushall()
        return backend
    from dramatiq_simplebroker import SimpleBrokerResultBackend

    return SimpleBrokerResultBackend(PEER_URL, simplebroker_namespace=peer_namespace)


@_peer_pytest.fixture()
def stub_result_backend(redis_result_backend: _PeerAny) -> _PeerAny:
    """Dramatiq's stub result backend fixture: here, the real one of the side."""
    return redis_result_backend


@_peer_pytest.fixture()
def result_backends(redis_result_backend: _PeerAny) -> dict[str, _PeerAny]:
    """Return the result backends by name (no memcached server here)."""
    return {"redis": redis_result_backend, "stub": redis_result_backend}


@_peer_pytest.fixture(params=["redis"])
def result_backend(request: _PeerAny, result_backends: dict[str, _PeerAny]) -> _PeerAny:
    """Dramatiq's parametrized result backend: the side's own."""
    return result_backends[request.param]


@_peer_pytest.fixture()
def redis_rate_limiter_backend() -> _PeerAny:
    """Return Dramatiq's Redis rate limiter backend on the runner's server, database 1.

    The same on both sides (rate limits are not the broker's); its own
    database is emptied for each test without touching the brokers' data.
    """
    backend = _peer_rl_backends.RedisBackend(url=PEER_URL.rsplit("/", 1)[0] + "/1")
    backend.client.flushdb()
    return backend


@_peer_pytest.fixture()
def rate_limiter_backends(
    redis_rate_limiter_backend: _PeerAny, stub_rate_limiter_backend: _PeerAny
) -> dict[str, _PeerAny]:
    """Return the rate limiter backends by name (no memcached server here)."""
    return {"redis": redis_rate_limiter_backend, "stub": stub_rate_limiter_backend}


@_peer_pytest.fixture(params=["redis", "stub"])
def rate_limiter_backend(request: _PeerAny, rate_limiter_backends: dict[str, _PeerAny]) -> _PeerAny:
    """Return the parametrized rate limiter backend (rate limits are not the broker's)."""
    return rate_limiter_backends[request.param]
