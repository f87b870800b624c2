"""Test fixtures: a real server started by the suite, one namespace per test.

A test module that sets ``TOPOLOGIES = ("single", "cluster", "sentinel")``
runs each of its tests on every topology named: ``redis_url`` (and every
fixture built on it) is then a single server, a 3-primary Redis Cluster with
one replica each, or a Sentinel group (one primary, one replica, three
sentinels). The cluster and the group start on first use and live for the
session; tests must not break them (the topology suite has its own).

Every suite also gets private servers a test may stop or kill
(``make_server``), child processes killed at the end of the test
(``children``), and the contract fixtures of ``support/contract.py``.
Helpers shared by the suites are in ``tests/support/``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.cluster import ClusterNode, RedisCluster
from redis.sentinel import Sentinel

from simplebroker_redis import AsyncRedisRunner, RedisRunner
from simplebroker_redis.core import RedisBrokerCore
from simplebroker_redis.devserver import DevCluster, DevSentinelGroup, DevServer
from support.contract import backend_kind, open_core, sb  # noqa: F401 - fixtures for every test
from support.namespaces import fresh_namespace
from support.processes import Children

#: Topologies a module runs on unless it sets ``TOPOLOGIES``.
DEFAULT_TOPOLOGIES = ("single",)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Run the tests of a module that sets ``TOPOLOGIES`` on each topology it names."""
    topologies = getattr(metafunc.module, "TOPOLOGIES", DEFAULT_TOPOLOGIES)
    if "topology" in metafunc.fixturenames and tuple(topologies) != DEFAULT_TOPOLOGIES:
        metafunc.parametrize("topology", topologies)


# Function-scoped on purpose: a session-scoped redis_url depending on a
# parametrized topology was reused across parameters in a full run (the
# servers behind it are session fixtures, so this costs nothing).
@pytest.fixture
def topology() -> str:
    """The topology ``redis_url`` points at (see the module docstring)."""
    return "single"


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevServer]:
    """One real Valkey/Redis server for the session (own port, own temp dir)."""
    srv = DevServer(data_dir=str(tmp_path_factory.mktemp("server")))
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def shared_cluster() -> Iterator[DevCluster]:
    """A 3-primary cluster shared by topology-parametrized tests.

    No replicas: on a busy host a slow primary could otherwise be failed over
    mid-test, and a failover may drop acknowledged writes (that is what the
    topology suite tests, with its own cluster).
    """
    with DevCluster(primaries=3, replicas=0, node_timeout_ms=15000) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def shared_sentinel() -> Iterator[DevSentinelGroup]:
    """One primary, one replica, three sentinels (data nodes password-protected).

    The sentinels wait 15 s before they call the primary down, so a busy host
    never triggers a failover (and its lost writes) under a contract test.
    """
    with DevSentinelGroup(replicas=1, password="shared-pw", down_after_ms=15000) as group:
        yield group


@pytest.fixture
def redis_url(topology: str, request: pytest.FixtureRequest) -> str:
    if topology == "cluster":
        return str(request.getfixturevalue("shared_cluster").url)
    if topology == "sentinel":
        return str(request.getfixturevalue("shared_sentinel").url)
    return str(request.getfixturevalue("server").url)


@pytest.fixture
def raw(redis_url: str, topology: str, request: pytest.FixtureRequest) -> Iterator[Any]:
    """A plain client for inspecting stored state (the primary, or a cluster client)."""
    client: Any
    if topology == "cluster":
        nodes = [
            ClusterNode("127.0.0.1", n.port)
            for n in request.getfixturevalue("shared_cluster").nodes
        ]
        client = RedisCluster(startup_nodes=nodes, decode_responses=True)
    elif topology == "sentinel":
        group = request.getfixturevalue("shared_sentinel")
        client = Sentinel(group.sentinel_addresses).master_for(
            group.service, password=group.password, decode_responses=True
        )
    else:
        client = redis.Redis.from_url(redis_url, decode_responses=True)
    yield client
    client.close()


@pytest.fixture
def namespace(redis_url: str) -> Iterator[str]:
    """A fresh namespace, removed after the test."""
    with fresh_namespace(redis_url) as name:
        yield name


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


@pytest.fixture
def make_server(tmp_path: Path) -> Iterator[Callable[..., DevServer]]:
    """Factory: start a private server (own port and data dir); all stopped after the test.

    ``make_server(name, appendonly=..., extra_args=[...], port=...)``; the
    same ``name`` reuses the data directory, so a restart reloads its files.
    A test may stop, kill, pause or reconfigure these servers.
    """
    servers: list[DevServer] = []

    def factory(name: str = "srv", **kwargs: Any) -> DevServer:
        server = DevServer(data_dir=str(tmp_path / name), **kwargs)
        servers.append(server)
        return server.start()

    yield factory
    for server in servers:
        try:
            server.stop()
        except Exception:  # noqa: BLE001 - teardown must stop every server
            pass


@pytest.fixture
def children(tmp_path: Path) -> Iterator[Children]:
    """Start child processes (workers, schedulers); every one is killed at the end of the test."""
    started = Children(tmp_path)
    yield started
    started.kill_all()
