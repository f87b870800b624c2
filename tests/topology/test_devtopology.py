"""DevCluster and DevSentinelGroup build real topologies that redis-py's clients can use."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest
import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.crc import key_slot
from redis.retry import Retry
from redis.sentinel import Sentinel

from simplebroker_redis.devserver import CLUSTER_SLOTS, DevCluster, DevSentinelGroup

from .conftest import DATA_PASSWORD, SENTINEL_PASSWORD

T = TypeVar("T")


@pytest.fixture
def rc(dev_cluster: DevCluster) -> Iterator[RedisCluster]:
    client = RedisCluster(
        startup_nodes=[ClusterNode("127.0.0.1", n.port) for n in dev_cluster.nodes],
        decode_responses=True,
    )
    yield client
    client.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _expand(token: str) -> range:
    low, _, high = token.partition("-")
    return range(int(low), int(high or low) + 1)


def test_cluster_serves_every_slot(dev_cluster: DevCluster) -> None:
    primaries = dev_cluster.primaries()
    assert len(primaries) == 3
    assert all(len(dev_cluster.replicas_of(p)) == 1 for p in primaries)
    for node in dev_cluster.nodes:
        info = node.cluster_info()
        assert info["cluster_state"] == "ok"
        assert info["cluster_slots_ok"] == str(CLUSTER_SLOTS)
        assert info["cluster_known_nodes"] == "6"
    views = dev_cluster.nodes[0].views()
    served = sorted(
        slot for p in primaries for token in views[p.node_id].slots for slot in _expand(token)
    )
    assert served == list(range(CLUSTER_SLOTS))  # each slot exactly once
    assert {dev_cluster.node_for_slot(slot) for slot in (0, 8000, CLUSTER_SLOTS - 1)} == set(
        primaries
    )
    seeds = dev_cluster.url.removeprefix("redis+cluster://").split(",")
    assert seeds == [f"127.0.0.1:{n.port}" for n in dev_cluster.nodes]


def test_cluster_key_written_through_redis_cluster_is_readable(
    dev_cluster: DevCluster, rc: RedisCluster
) -> None:
    keys = [f"dev-{i}" for i in range(60)]
    for key in keys:
        rc.set(key, key.upper())
    assert [rc.get(key) for key in keys] == [key.upper() for key in keys]
    # node_for_key() names the node the client wrote to.
    for key in keys[:10]:
        assert dev_cluster.node_for_key(key).call("GET", key) == key.upper()


def test_cluster_migrate_slot_there_and_back_keeps_data(
    dev_cluster: DevCluster, rc: RedisCluster
) -> None:
    slot = key_slot(b"mig")
    keys = [f"{{mig}}:{i}" for i in range(250)]  # more than one MIGRATE batch
    for key in keys:
        rc.set(key, key)
    home = dev_cluster.node_for_slot(slot)
    target = next(p for p in dev_cluster.primaries() if p is not home)

    dev_cluster.migrate_slot(slot, target)

    assert dev_cluster.node_for_slot(slot) is target
    assert target.call("CLUSTER", "COUNTKEYSINSLOT", slot) == len(keys)
    assert home.call("CLUSTER", "COUNTKEYSINSLOT", slot) == 0
    assert all(node.views()[target.node_id].owns(slot) for node in dev_cluster.nodes)
    assert [rc.get(key) for key in keys] == keys  # the client follows MOVED

    dev_cluster.migrate_slot(slot, home)

    assert dev_cluster.node_for_slot(slot) is home
    assert home.call("CLUSTER", "COUNTKEYSINSLOT", slot) == len(keys)
    assert [rc.get(key) for key in keys] == keys


def test_cluster_kill_primary_promotes_replica_and_restart_rejoins(
    dev_cluster: DevCluster, rc: RedisCluster
) -> None:
    rc.set("{kill}:k", "v")
    # WAIT has no key: it must go to the node that took the write.
    assert rc.wait(1, 5000, target_nodes=rc.get_node_from_key("{kill}:k")) == 1
    victim = dev_cluster.node_for_key("{kill}:k")
    (replica,) = dev_cluster.replicas_of(victim)

    dev_cluster.kill(victim)

    assert dev_cluster.node_for_key("{kill}:k") is replica
    assert replica.call("GET", "{kill}:k") == "v"

    dev_cluster.restart(victim)

    assert dev_cluster.replicas_of(replica) == [victim]
    assert all(n.cluster_info()["cluster_state"] == "ok" for n in dev_cluster.nodes)


def test_cluster_stop_kills_every_node_and_removes_its_dir() -> None:
    cluster = DevCluster(primaries=1).start()
    pids = [n.process.pid for n in cluster.nodes if n.process is not None]
    root = cluster.root
    assert os.path.isdir(root) and pids

    cluster.stop()

    assert not os.path.exists(root)
    assert not any(_alive(pid) for pid in pids)


@pytest.mark.parametrize("kind", [DevCluster, DevSentinelGroup])
def test_failed_start_cleans_up(kind: type[DevCluster] | type[DevSentinelGroup]) -> None:
    topology = kind(binary="/bin/false")
    with pytest.raises(RuntimeError, match="exited early"):
        topology.start(timeout=10)
    assert not os.path.exists(topology.root)


def _sentinel(group: DevSentinelGroup) -> Sentinel:
    return Sentinel(
        group.sentinel_addresses,
        sentinel_kwargs={"password": SENTINEL_PASSWORD, "socket_timeout": 2},
        password=DATA_PASSWORD,
        socket_timeout=2,
    )


def test_sentinel_group_is_ready(dev_sentinel: DevSentinelGroup) -> None:
    primary = dev_sentinel.primary()
    assert primary.call("ROLE")[0] == "master"
    assert [n.call("ROLE")[0] for n in dev_sentinel.replicas()] == ["slave"]
    ports = ",".join(f"127.0.0.1:{s.port}" for s in dev_sentinel.sentinels)
    assert dev_sentinel.url == f"redis+sentinel://:{DATA_PASSWORD}@{ports}/mymaster/0"
    no_password = redis.Redis(port=dev_sentinel.sentinels[0].port, retry=Retry(NoBackoff(), 0))
    with pytest.raises(redis.AuthenticationError):
        no_password.execute_command("SENTINEL", "MASTERS")


def test_sentinel_failover_moves_primary_and_master_for_follows(
    dev_sentinel: DevSentinelGroup,
) -> None:
    master = _sentinel(dev_sentinel).master_for("mymaster", decode_responses=True)
    master.set("before", "1")
    old = dev_sentinel.primary()

    new = dev_sentinel.failover()

    assert new is not old
    assert dev_sentinel.primary() is new
    assert old.call("ROLE")[:2] == ["slave", "127.0.0.1"]
    fresh = _sentinel(dev_sentinel).master_for("mymaster", decode_responses=True)
    assert fresh.connection_pool.get_master_address() == ("127.0.0.1", new.port)
    assert fresh.get("before") == "1"
    fresh.set("after", "2")
    assert new.call("GET", "after") == "2"
    # The client made before the failover reaches the new primary as well.
    assert _eventually(lambda: master.get("after")) == "2"


def test_sentinel_kill_primary_promotes_replica_and_restarts_old_one(
    dev_sentinel: DevSentinelGroup,
) -> None:
    master = _sentinel(dev_sentinel).master_for("mymaster", decode_responses=True)
    master.set("survives", "yes")
    master.wait(1, 5000)
    old = dev_sentinel.primary()

    new = dev_sentinel.kill_primary(restart=True)

    assert new is not old
    assert old.call("ROLE")[0] == "slave"
    assert _eventually(lambda: master.get("survives")) == "yes"


def _eventually(read: Callable[[], T], timeout: float = 10.0) -> T:
    """Return ``read()`` once it stops raising connection errors (a client may see one)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return read()
        except (redis.ConnectionError, redis.TimeoutError, redis.ReadOnlyError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
