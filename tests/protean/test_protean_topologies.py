"""The provider on every Redis target form: a server, a Cluster, Sentinel, a unix socket.

``URI`` goes to the redis backend's own target parser and runner, so every
form the backend takes works here; these tests run the provider's whole
cycle (publish, two groups, nack and redelivery, a blocking read woken by
a publish, a dead letter) on each. ``rediss://`` is in
tests/faults/test_protean_tls.py (it needs a TLS-capable server binary).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from protean.domain import Domain

from protean_simplebroker import SimpleBrokerBroker
from simplebroker_redis import redis_backend_plugin
from simplebroker_redis.devserver import DevServer

TOPOLOGIES = ("single", "cluster", "sentinel")
STREAM = "ops::job"


def cycle(broker: SimpleBrokerBroker) -> None:
    """Run the provider's delivery cycle once; raise on the first failure."""
    ids = [broker.publish(STREAM, {"n": n}) for n in range(3)]
    for group in ("a", "b"):
        got = broker.read(STREAM, group, 10)
        assert [i for i, _ in got] == ids
        assert broker.nack(STREAM, ids[0], group)
        assert broker.read(STREAM, group, 10) == [(ids[0], {"n": 0})]
        for identifier in ids:
            assert broker.ack(STREAM, identifier, group)
    # A blocking read sleeps on the backend's waiter and wakes for a publish.
    later: list[str] = []
    publisher = threading.Timer(0.3, lambda: later.append(broker.publish(STREAM, {"n": 3})))
    publisher.start()
    started = time.monotonic()
    woke = broker.read_blocking(STREAM, "a", "c1", timeout_ms=10_000)
    assert time.monotonic() - started < 9, "woken by the publish, not by the timeout"
    publisher.join()  # the read can return before the publishing thread records the id
    assert [i for i, _ in woke] == later
    broker._max_retries = 0  # the next nack dead-letters
    assert broker.nack(STREAM, later[0], "a")
    assert [e.original_id for e in broker.dlq_list([f"{STREAM}:dlq"])] == later


def make(uri: str, namespace: str) -> SimpleBrokerBroker:
    domain = Domain(name="topology-tests")
    info = {"provider": "simplebroker", "URI": uri, "NAMESPACE": namespace}
    return SimpleBrokerBroker("default", domain, info)


def test_the_cycle_on_each_topology(redis_url: str, namespace: str) -> None:
    broker = make(redis_url, namespace)
    try:
        cycle(broker)
        assert broker.ping()
    finally:
        broker.close()


@pytest.fixture(scope="module")
def socket_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevServer]:
    server = DevServer(data_dir=str(tmp_path_factory.mktemp("unix")), unix_socket=True)
    server.start()
    yield server
    server.stop()


def test_the_cycle_over_a_unix_socket(socket_server: DevServer, tmp_path: Path) -> None:
    assert socket_server.url.startswith("unix://")
    broker = make(socket_server.url, "unix-ns")
    try:
        cycle(broker)
    finally:
        broker.close()
        redis_backend_plugin.cleanup_target(
            socket_server.url, backend_options={"namespace": "unix-ns"}
        )
