"""The Protean provider over ``rediss://`` (a verified CA), commands and wake-ups alike.

The TLS fixtures (certificates, a TLS-capable server binary) are those of
conftest.py; the cycle is the one tests/protean/test_protean_topologies.py
runs on the other target forms.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from simplebroker_redis import redis_backend_plugin
from simplebroker_redis.devserver import DevServer, TlsFiles, free_port

pytest.importorskip("protean", reason="the protean extra is not installed")

from protean.domain import Domain  # noqa: E402

from protean_simplebroker import SimpleBrokerBroker  # noqa: E402


@pytest.fixture(scope="module")
def rediss_url(
    tls_binary: str,
    tls_files: TlsFiles,
    certificates: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[str]:
    """A ``rediss://`` URL of a server with a TLS port, verified against the test CA."""
    port = free_port()
    server = DevServer(
        data_dir=str(tmp_path_factory.mktemp("protean-tls")),
        extra_args=["--tls-port", str(port), *tls_files.args()],
        binary=tls_binary,
    )
    server.start()
    yield f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={certificates / 'ca.crt'}"
    server.stop()


def test_the_provider_over_verified_tls(rediss_url: str) -> None:
    domain = Domain(name="tls-tests")
    info = {"provider": "simplebroker", "URI": rediss_url, "NAMESPACE": "protean-tls"}
    broker = SimpleBrokerBroker("default", domain, info)
    try:
        ids = [broker.publish("tls::job", {"n": n}) for n in range(3)]
        assert [i for i, _ in broker.read("tls::job", "g", 10)] == ids
        assert all(broker.ack("tls::job", identifier, "g") for identifier in ids)
        later: list[str] = []
        publisher = threading.Timer(0.3, lambda: later.append(broker.publish("tls::job", {"n": 3})))
        publisher.start()
        started = time.monotonic()
        woke = broker.read_blocking("tls::job", "g", "c", timeout_ms=10_000)
        assert time.monotonic() - started < 9, "woken over the TLS Pub/Sub connection"
        publisher.join()  # the read can return before the publishing thread records the id
        assert [i for i, _ in woke] == later
    finally:
        broker.close()
        redis_backend_plugin.cleanup_target(
            rediss_url, backend_options={"namespace": "protean-tls"}
        )
