"""TLS topologies: ``rediss+cluster://`` and ``rediss+sentinel://`` against real servers.

A 3-primary Redis Cluster whose nodes serve, gossip (``tls-cluster``) and
replicate over TLS, and a Sentinel group (one primary, one replica, three
sentinels) whose data nodes serve and replicate over TLS while clients ask
the sentinels in plain TCP. Each starts once for the module, from the
TLS-capable binary and with the throwaway certificates of conftest.py, and
is password-protected so that failures can be checked for leaks.

The servers name their TLS ports only to TLS clients (CLUSTER SLOTS, MOVED)
and the sentinels name the data nodes' TLS ports, so the backend must carry
the URL's TLS options to every node it finds. Every data node keeps a plain
port for admin calls, where CLIENT LIST shows which port each backend
connection (commands and wake-up subscriptions) used.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.crc import key_slot
from simplebroker.ext import OperationalError
from taskiq.receiver import Receiver

from simplebroker_redis import AccessDenied, RedisRunner, redis_backend_plugin
from simplebroker_redis.core import RedisBrokerCore
from simplebroker_redis.devserver import DevCluster, DevNode, DevSentinelGroup, TlsFiles
from simplebroker_redis.keys import Keyspace
from taskiq_simplebroker import SimpleBrokerResultBackend, SimpleBrokerTaskiqBroker

from .exercise import exercise
from .faulthelpers import QUOTED, SECRET, assert_secret_free, texts_of, watch_backend_ports

# TLS needs a TLS-capable server binary: these run once, on Debian's redis-server.
pytestmark = pytest.mark.once

#: The two TLS topologies, as test parameters (not TOPOLOGIES: tests/conftest.py reads that).
TLS_KINDS = ("cluster", "sentinel")


@pytest.fixture(scope="module")
def tls_cluster(tls_binary: str, tls_files: TlsFiles) -> Iterator[DevCluster]:
    """Three primaries, no replicas (nothing here fails over); slow to call a node down."""
    with DevCluster(
        primaries=3,
        replicas=0,
        password=SECRET,
        node_timeout_ms=15000,
        binary=tls_binary,
        tls=tls_files,
    ) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def tls_sentinel(tls_binary: str, tls_files: TlsFiles) -> Iterator[DevSentinelGroup]:
    """One primary, one replica, three sentinels; 15 s before a primary counts as down."""
    with DevSentinelGroup(
        replicas=1, password=SECRET, down_after_ms=15000, binary=tls_binary, tls=tls_files
    ) as group:
        yield group


class Tls:
    """One TLS topology as a test sees it: URLs, its data nodes, the namespace's primary."""

    def __init__(self, topology: DevCluster | DevSentinelGroup) -> None:
        self.topology = topology
        self.nodes: Sequence[DevNode] = topology.nodes

    def url(self, query: str | None = None) -> str:
        """Return the topology's URL, with ``query`` instead of its ``ssl_ca_certs=...``."""
        url = self.topology.url
        return url if query is None else f"{url.partition('?')[0]}?{query}"

    def primary_of(self, namespace: str) -> DevNode:
        """Return the data node that holds ``namespace`` now."""
        if isinstance(self.topology, DevCluster):
            return self.topology.node_for_key(Keyspace.for_namespace(namespace).meta)
        return self.topology.primary()

    def tls_ports(self) -> set[int]:
        return {node.announced_port for node in self.nodes}

    def admins(self) -> list[redis.Redis]:
        """Plain clients on every data node's admin port."""
        return [
            redis.Redis(port=node.port, password=node.password, decode_responses=True)
            for node in self.nodes
        ]


@pytest.fixture(params=TLS_KINDS)
def tls(request: pytest.FixtureRequest) -> Tls:
    """Each TLS topology in turn."""
    return Tls(request.getfixturevalue(f"tls_{request.param}"))


def _namespace(label: str) -> str:
    return f"tls-{label}-{uuid.uuid4().hex[:8]}"


def _close(clients: Sequence[redis.Redis]) -> None:
    for client in clients:
        client.close()


def _exercise_over_tls(tls: Tls, url: str, label: str) -> None:
    """Run every operation at ``url``; check where each kind of connection went."""
    namespace = _namespace(label)
    admins = tls.admins()
    try:
        with watch_backend_ports(admins) as seen:
            exercise(url, namespace)
    finally:
        _close(admins)
    primary = tls.primary_of(namespace).announced_port
    # Commands and wake-up subscriptions reached the namespace's primary on its
    # TLS port (CLIENT LIST shows a connection only after its TLS handshake),
    # and no backend connection used a plain port.
    assert {("command", primary), ("wake", primary)} <= seen
    assert {port for _, port in seen} <= tls.tls_ports()


def test_every_operation_over_tls(tls: Tls) -> None:
    """Messages, queues, reservations, both wake-up paths, asyncio and Taskiq: all over TLS."""
    _exercise_over_tls(tls, tls.url(), "all")


def test_client_certificates_reach_every_node(tls: Tls, certificates: Path) -> None:
    """With client certificates required, the URL's certificate opens every connection."""
    with_cert = (
        f"ssl_ca_certs={certificates / 'ca.crt'}&ssl_certfile={certificates / 'client.crt'}"
        f"&ssl_keyfile={certificates / 'client.key'}"
    )
    running = [node for node in tls.nodes if node.alive]
    for node in running:
        node.call("CONFIG", "SET", "tls-auth-clients", "yes")
    try:
        without = RedisRunner(tls.url(), namespace=_namespace("nocert"), pool_timeout=0.5)
        with pytest.raises(OperationalError) as info:
            without.ensure_initialized()
        # TLS 1.3: the refusal arrives after the handshake, as an alert or an EOF.
        assert "cannot reach" in str(info.value)
        assert_secret_free(texts_of(info.value))
        without.shutdown()
        _exercise_over_tls(tls, tls.url(with_cert), "cert")
    finally:
        for node in running:
            node.call("CONFIG", "SET", "tls-auth-clients", "optional")


def test_cluster_follows_a_moved_slot_to_its_tls_port(tls_cluster: DevCluster) -> None:
    """MOVED names the new owner's TLS port to a TLS client; the backend follows it there."""
    tls = Tls(tls_cluster)
    namespace = _namespace("moved")
    core = RedisBrokerCore(RedisRunner(tls.url(), namespace=namespace), owns_runner=True)
    admins = tls.admins()
    try:
        first = core.write("jobs", "before the move")
        source = tls.primary_of(namespace)
        target = next(node for node in tls_cluster.primaries() if node is not source)
        slot = key_slot(Keyspace.for_namespace(namespace).meta.encode())
        tls_cluster.migrate_slot(slot, target)
        with watch_backend_ports(admins) as seen:
            second = core.write("jobs", "after the move")
            assert core.claim_many("jobs", 10) == [
                ("before the move", first),
                ("after the move", second),
            ]
        assert ("command", target.announced_port) in seen
        assert {port for _, port in seen} <= tls.tls_ports()
    finally:
        _close(admins)
        core.shutdown()
        redis_backend_plugin.cleanup_target(tls.url(), backend_options={"namespace": namespace})


@asynccontextmanager
async def _receiving(broker: SimpleBrokerTaskiqBroker) -> AsyncIterator[None]:
    """Run Taskiq's own Receiver on ``broker`` in this process (as tests/taskiq do)."""
    broker.is_worker_process = True
    finish = asyncio.Event()
    task = asyncio.create_task(Receiver(broker).listen(finish))
    try:
        yield
    finally:
        finish.set()
        await asyncio.wait_for(task, 10)
        await broker.shutdown()


def _taskiq_broker(url: str, namespace: str) -> SimpleBrokerTaskiqBroker:
    broker = SimpleBrokerTaskiqBroker(
        url, namespace=namespace, lease_seconds=2.0, heartbeat_interval=0.5
    )
    return broker.with_result_backend(SimpleBrokerResultBackend(runner=broker.runner))


async def test_taskiq_round_trip_over_tls(tls: Tls) -> None:
    """A worker runs a kicked task; the producer reads its result from the result backend."""
    namespace = _namespace("taskiq")
    worker = _taskiq_broker(tls.url(), namespace)

    @worker.task(task_name="tls:double")
    async def double(n: int) -> int:
        return 2 * n

    producer = _taskiq_broker(tls.url(), namespace)
    await producer.startup()
    try:
        tasks = [await double.kicker().with_broker(producer).kiq(n) for n in range(5)]
        async with _receiving(worker):
            results = [await task.wait_result(timeout=30) for task in tasks]
        assert [result.return_value for result in results] == [0, 2, 4, 6, 8]
        assert not any(result.is_err for result in results)
    finally:
        await producer.shutdown()
        redis_backend_plugin.cleanup_target(tls.url(), backend_options={"namespace": namespace})


#: (topology, target form, expected words). ``{tls}``/``{plain}``: the nodes'
#: TLS/plain ports, or the sentinels' plain ports for ``{sentinels}``.
_FAILURES: list[tuple[str, str, str]] = [
    ("cluster", "rediss+cluster://:{pw}@{tls}?ssl_ca_certs={other}", "certificate verify failed"),
    ("cluster", "redis+cluster://:{pw}@{tls}", "cannot reach"),
    # One seed: a TLS handshake with a plain port waits out the 2 s connect timeout,
    # then the port, asked in plain text once, answers: a mismatch, final.
    ("cluster", "rediss+cluster://:{pw}@{plain}?ssl_ca_certs={ca}", "TLS mismatch: 127.0.0.1:"),
    (
        "sentinel",
        "rediss+sentinel://:{pw}@{sentinels}/mymaster?ssl_ca_certs={other}",
        "certificate verify failed",
    ),
    ("sentinel", "redis+sentinel://:{pw}@{sentinels}/mymaster", "cannot reach"),
]


@pytest.mark.parametrize(
    ("kind", "target", "expected"),
    _FAILURES,
    ids=["cluster-wrong-ca", "cluster-plain-to-tls", "cluster-tls-to-plain", "sentinel-wrong-ca",
         "sentinel-plain-to-tls"],
)  # fmt: skip
def test_tls_failures_are_clear_and_redacted(
    kind: str, target: str, expected: str, certificates: Path, request: pytest.FixtureRequest
) -> None:
    dev: Any = request.getfixturevalue(f"tls_{kind}")
    sentinels = dev.sentinel_addresses if kind == "sentinel" else []
    url = target.format(
        pw=QUOTED,
        tls=",".join(f"127.0.0.1:{node.announced_port}" for node in dev.nodes),
        plain=f"127.0.0.1:{dev.nodes[0].port}",
        sentinels=",".join(f"127.0.0.1:{port}" for _, port in sentinels),
        ca=certificates / "ca.crt",
        other=certificates / "other-ca.crt",
    )
    runner = RedisRunner(url, namespace=_namespace("fail"), pool_timeout=0.5)
    with pytest.raises(OperationalError) as info:
        runner.ensure_initialized()
    assert expected in str(info.value)
    # A failed certificate check or a plain-text port is final (AccessDenied):
    # nothing waits for it.
    final = expected in ("certificate verify failed", "TLS mismatch: 127.0.0.1:")
    assert isinstance(info.value, AccessDenied) == final, repr(info.value)
    assert_secret_free(texts_of(info.value))
    runner.shutdown()
