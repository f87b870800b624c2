"""Test fixtures: a real server started by the suite, one namespace per test."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
import redis

from simplebroker_redis import RedisRunner, redis_backend_plugin
from simplebroker_redis.aio import AsyncRedisRunner
from simplebroker_redis.core import RedisBrokerCore
from simplebroker_redis.devserver import DevServer


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevServer]:
    """One real Valkey/Redis server for the session (own port, own temp dir)."""
    srv = DevServer(data_dir=str(tmp_path_factory.mktemp("server")))
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def redis_url(server: DevServer) -> str:
    return server.url


@pytest.fixture
def raw(redis_url: str) -> Iterator[redis.Redis]:
    """A plain client for inspecting stored state."""
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    yield client
    client.close()


@pytest.fixture
def namespace(redis_url: str) -> Iterator[str]:
    """A fresh namespace, removed after the test."""
    ns = f"t-{os.getpid()}-{uuid.uuid4().hex[:12]}"
    yield ns
    redis_backend_plugin.cleanup_target(redis_url, backend_options={"namespace": ns})


@pytest.fixture
def runner(redis_url: str, namespace: str) -> Iterator[RedisRunner]:
    r = RedisRunner(redis_url, namespace=namespace)
    yield r
    r.shutdown()


@pytest.fixture
def broker(runner: RedisRunner) -> Iterator[RedisBrokerCore]:
    core = RedisBrokerCore(runner)
    yield core
    core.close()


@pytest.fixture
async def arunner(redis_url: str, namespace: str) -> AsyncIterator[AsyncRedisRunner]:
    """An asyncio runner on this test's namespace (initialized)."""
    r = AsyncRedisRunner(redis_url, namespace=namespace)
    await r.ensure_initialized()
    yield r
    await r.aclose()


@pytest.fixture
def options(namespace: str) -> dict[str, object]:
    return {"namespace": namespace}


# Backend-parametrized contract fixtures (``sb``, ``open_core``, ``backend_kind``).
from helpers import backend_kind, open_core, sb  # noqa: E402,F401 - fixtures re-exported for pytest
