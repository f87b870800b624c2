"""Start-up refuses a server that may evict queued tasks (``maxmemory-policy allkeys-*``)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis
from tqhelpers import kiq

from simplebroker_redis.devserver import DevServer
from support.namespaces import fresh_namespace
from taskiq_simplebroker import (
    ConfigurationError,
    EvictionPolicyError,
    SimpleBrokerResultBackend,
    SimpleBrokerTaskiqBroker,
)


@pytest.fixture(scope="module")
def policy_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevServer]:
    """A private server whose maxmemory-policy each test sets."""
    folder = str(tmp_path_factory.mktemp("policy"))
    with DevServer(data_dir=folder, extra_args=["--maxmemory-policy", "allkeys-lru"]) as server:
        yield server


@pytest.fixture
def admin(policy_server: DevServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(policy_server.url, decode_responses=True)
    client.config_set("maxmemory-policy", "allkeys-lru")
    yield client
    client.close()


@pytest.fixture
def ns(policy_server: DevServer) -> Iterator[str]:
    with fresh_namespace(policy_server.url, "policy") as name:
        yield name


def pair(url: str, namespace: str, **allow: bool) -> SimpleBrokerTaskiqBroker:
    broker = SimpleBrokerTaskiqBroker(
        url, namespace=namespace, allow_eviction=allow.get("broker", False)
    )
    return broker.with_result_backend(
        SimpleBrokerResultBackend(runner=broker.runner, allow_eviction=allow.get("results", False))
    )


async def test_allkeys_policies_are_refused_unless_allowed(policy_server, admin, ns):
    url = policy_server.url
    refused = pair(url, ns)
    with pytest.raises(EvictionPolicyError, match="maxmemory-policy allkeys-lru") as info:
        await refused.startup()
    assert "allow_eviction=True to SimpleBrokerTaskiqBroker" in str(info.value)
    assert isinstance(info.value, ConfigurationError)
    await refused.shutdown()
    # The broker checks its result backend too: each opt-out is its own.
    half = pair(url, ns, broker=True)
    with pytest.raises(EvictionPolicyError, match="to SimpleBrokerResultBackend"):
        await half.startup()
    await half.shutdown()
    alone = SimpleBrokerResultBackend(url, namespace=ns)
    with pytest.raises(EvictionPolicyError):
        await alone.startup()
    await alone.shutdown()

    allowed = pair(url, ns, broker=True, results=True)
    await allowed.startup()
    await kiq(allowed, "add", 1, 2)
    await allowed.shutdown()


async def test_volatile_and_noeviction_policies_start(policy_server, admin, ns):
    for policy in ("volatile-lru", "noeviction"):
        admin.config_set("maxmemory-policy", policy)
        broker = pair(policy_server.url, ns)
        await broker.startup()
        await broker.shutdown()


@pytest.mark.parametrize(
    ("denied", "refused"),
    [("-info", True), ("-info -config", False)],
    ids=["config-only", "neither"],
)
async def test_the_policy_is_read_where_the_acl_allows(
    policy_server, admin, ns, denied, refused, caplog
):
    user, password = f"u{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    admin.execute_command(
        "ACL", "SETUSER", user, "on", f">{password}", "~*", "&*", "+@all", *denied.split()
    )
    url = f"redis://{user}:{password}@127.0.0.1:{policy_server.port}/0"
    backend = SimpleBrokerResultBackend(url, namespace=ns)
    try:
        if refused:  # INFO denied: CONFIG GET tells
            with pytest.raises(EvictionPolicyError):
                await backend.startup()
        else:  # a managed service that allows neither: started, and said so
            with caplog.at_level("INFO", logger="taskiq_simplebroker"):
                await backend.startup()
            assert "cannot read maxmemory-policy" in caplog.text
    finally:
        await backend.shutdown()
        admin.execute_command("ACL", "DELUSER", user)
