"""Cluster and Sentinel targets: credentials, errors, durability (WAIT/WAITAOF) and routing."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
import redis
from simplebroker.ext import OperationalError

from simplebroker_redis import RedisRunner, ReplicationTimeout, redis_backend_plugin
from simplebroker_redis.core import RedisBrokerCore
from simplebroker_redis.devserver import DevCluster, DevSentinelGroup, DevServer

from .conftest import SENTINEL_PASSWORD


@pytest.fixture
def ns() -> Iterator[str]:
    yield f"tc-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _commands(node: DevServer, name: str) -> int:
    stats = node.call("INFO", "commandstats")
    entry = stats.get(f"cmdstat_{name}") if isinstance(stats, dict) else None
    if entry is None:
        for line in str(stats).splitlines():
            if line.startswith(f"cmdstat_{name}:"):
                return int(line.split("calls=")[1].split(",")[0])
        return 0
    return int(entry["calls"])


def test_sentinel_target_with_both_passwords(dev_sentinel: DevSentinelGroup, ns: str) -> None:
    runner = RedisRunner(
        dev_sentinel.url, namespace=ns, sentinel_password=SENTINEL_PASSWORD, wait_replicas=1
    )
    core = RedisBrokerCore(runner)
    primary = dev_sentinel.primary()
    waits = _commands(primary, "wait")
    core.write("q", "one")
    core.write("q", "two")
    assert core.peek_many("q", 10, with_timestamps=False) == ["one", "two"]
    # Each write was followed by WAIT on its connection; the peek was not.
    assert _commands(primary, "wait") - waits == 2
    assert SENTINEL_PASSWORD not in repr(runner) and "data-pw" not in runner.where
    core.close()
    redis_backend_plugin.cleanup_target(
        dev_sentinel.url,
        backend_options={"namespace": ns, "sentinel_password": SENTINEL_PASSWORD},
    )
    runner.shutdown()


def test_sentinel_without_its_password_names_the_problem(
    dev_sentinel: DevSentinelGroup, ns: str
) -> None:
    runner = RedisRunner(dev_sentinel.url, namespace=ns, pool_timeout=0.5)
    with pytest.raises(OperationalError, match="No master found") as info:
        RedisBrokerCore(runner)
    assert "data-pw" not in str(info.value) and SENTINEL_PASSWORD not in str(info.value)
    runner.shutdown()


def test_too_few_replicas_raise_replication_timeout_after_the_write(
    dev_sentinel: DevSentinelGroup, ns: str
) -> None:
    runner = RedisRunner(
        dev_sentinel.url,
        namespace=ns,
        sentinel_password=SENTINEL_PASSWORD,
        wait_replicas=2,  # the group has one replica
        wait_timeout=0.2,
    )
    core = RedisBrokerCore(runner)
    with pytest.raises(ReplicationTimeout, match="happened.*1 of 2 replicas") as info:
        core.write("q", "maybe")
    assert info.value.retryable is False
    assert core.peek_many("q", 10, with_timestamps=False) == ["maybe"]  # reads do not WAIT
    core.close()
    runner.shutdown()


def test_wait_aof_needs_waitaof(ns: str) -> None:
    with DevServer(appendonly=True) as server:
        admin = redis.Redis.from_url(server.url, decode_responses=True)
        runner = RedisRunner(server.url, namespace=ns, wait_aof=True)
        if "waitaof" in admin.command_list():
            core = RedisBrokerCore(runner)
            core.write("q", "fsynced")  # WAITAOF 1 0 ...: the primary's AOF
            assert int(admin.info("commandstats")["cmdstat_waitaof"]["calls"]) == 1
            core.close()
        else:  # Redis 7.0: refused before anything is written
            with pytest.raises(OperationalError, match="needs WAITAOF.*nothing was written"):
                RedisBrokerCore(runner).write("q", "never")
            assert admin.zcard(runner.keys.pending) == 0
        admin.close()
        runner.shutdown()


def test_cluster_runner_routes_to_the_slot_owner_and_waits(
    dev_cluster: DevCluster, ns: str
) -> None:
    runner = RedisRunner(dev_cluster.url, namespace=ns, wait_replicas=1)
    core = RedisBrokerCore(runner)
    core.write("q", "x")
    owner = dev_cluster.node_for_key(runner.keys.meta)
    assert runner.client.connection_pool.connection_kwargs["port"] == owner.port
    assert owner.call("HGET", runner.keys.meta, "magic") == "simplebroker-redis"
    core.close()
    assert redis_backend_plugin.cleanup_target(dev_cluster.url, backend_options={"namespace": ns})
    assert owner.call("EXISTS", runner.keys.meta) == 0
    runner.shutdown()


def test_unreachable_cluster_seeds_give_a_clear_error(ns: str) -> None:
    runner = RedisRunner(
        "redis+cluster://:pw@127.0.0.1:1,127.0.0.1:2", namespace=ns, pool_timeout=0.3
    )
    with pytest.raises(OperationalError, match="no seed node named the primary") as info:
        RedisBrokerCore(runner)
    assert ":pw@" not in str(info.value)
    runner.shutdown()


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("redis+cluster://", "no seed node"),
        ("redis+cluster://:secret@host", "needs a port"),
        ("redis+cluster://:secret@h:1/2", "only db 0"),
        ("redis+sentinel://:secret@h:1", "name the sentinel service"),
        ("redis+sentinel://:secret@h:1/svc/x", "must be a db number"),
        ("redis+sentinel://:secret@h:1/svc/1/2", "unexpected path"),
        ("redis+tunnel://:secret@h:1", "redis\\+cluster://"),
    ],
)
def test_bad_topology_targets_are_named_without_passwords(target: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        RedisRunner(target)
    assert "secret" not in str(info.value)


def test_a_valid_cluster_target_is_redacted_everywhere() -> None:
    runner = RedisRunner("rediss+cluster://u:secret@h1:1,h2:2?ssl_cert_reqs=none")
    assert "secret" not in repr(runner) and "secret" not in runner.where
    assert runner.connections.spec.hosts == (("h1", 1), ("h2", 2))
    runner.shutdown()


@pytest.mark.parametrize(
    ("target", "path_and_service"),
    [
        ("rediss+cluster://:pw@h1:1,h2:2?ssl_ca_certs=/etc/ca.pem", (0, None)),
        ("rediss+cluster://:pw@h1:1,h2:2/0?ssl_ca_certs=/etc/ca.pem", (0, None)),
        ("rediss+sentinel://:pw@h1:1,h2:2/svc?ssl_ca_certs=/etc/ca.pem", (0, "svc")),
        ("rediss+sentinel://:pw@h1:1/svc/3?ssl_ca_certs=/etc/ca.pem", (3, "svc")),
    ],
)
def test_tls_options_with_slashes_stay_in_the_query(
    target: str, path_and_service: tuple[int, str | None]
) -> None:
    """A CA path in the query is not read as a path (a cluster target has none before it)."""
    spec = RedisRunner(target).connections.spec
    assert (spec.db, spec.service) == path_and_service
    assert spec.query == "ssl_ca_certs=/etc/ca.pem"
    assert spec.node_url("h9", 9) == f"rediss://:pw@h9:9/{spec.db}?ssl_ca_certs=/etc/ca.pem"


def test_a_plain_url_of_a_cluster_node_says_to_use_a_cluster_target(
    dev_cluster: DevCluster, ns: str
) -> None:
    probe = RedisRunner("redis://127.0.0.1:1/0", namespace=ns)
    owner = dev_cluster.node_for_key(probe.keys.meta)
    probe.shutdown()
    other = next(node for node in dev_cluster.primaries() if node is not owner)
    runner = RedisRunner(f"redis://127.0.0.1:{other.port}/0", namespace=ns)
    with pytest.raises(OperationalError, match=r"use a redis\+cluster:// target"):
        RedisBrokerCore(runner)
    runner.shutdown()
