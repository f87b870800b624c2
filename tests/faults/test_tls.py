"""TLS: ``rediss://`` against a server started with a throwaway certificate.

The certificates (a CA, a server certificate for 127.0.0.1, a client
certificate) are made by ``openssl`` for the test. The bundled Valkey is
built without TLS, so the server is the first TLS-capable binary among the
configured one and those on PATH (fixtures in conftest.py, shared with
test_tls_topologies.py).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import redis
from simplebroker.ext import OperationalError

from simplebroker_redis import AccessDenied, RedisRunner, redis_backend_plugin
from simplebroker_redis.core import RedisBrokerCore
from simplebroker_redis.devserver import DevServer, TlsFiles, free_port

from .exercise import exercise, exercise_celery, exercise_dramatiq
from .faulthelpers import (
    QUOTED,
    assert_secret_free,
    broker_cli,
    texts_of,
    watch_backend_ports,
    write_project,
)

# TLS needs a TLS-capable server binary: these run once, on Debian's redis-server.
pytestmark = pytest.mark.once


@dataclass(frozen=True)
class TlsServer:
    """A server with a TLS port beside its plain (admin) port."""

    server: DevServer
    tls_port: int

    @property
    def admin_url(self) -> str:
        return self.server.url

    def url(self, query: str = "", scheme: str = "rediss", userinfo: str = "") -> str:
        return f"{scheme}://{userinfo}127.0.0.1:{self.tls_port}/0{'?' + query if query else ''}"


@pytest.fixture(scope="module")
def tls_server(
    tls_binary: str, tls_files: TlsFiles, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TlsServer]:
    """Client certificates are optional, so one server serves every TLS test."""
    port = free_port()
    server = DevServer(
        data_dir=str(tmp_path_factory.mktemp("tls-server")),
        extra_args=["--tls-port", str(port), *tls_files.args()],
        binary=tls_binary,
    )
    server.start()
    yield TlsServer(server, port)
    server.stop()


def test_every_operation_over_verified_tls(tls_server, certificates):
    url = tls_server.url(f"ssl_ca_certs={certificates / 'ca.crt'}")
    admin = redis.Redis.from_url(tls_server.admin_url, decode_responses=True)
    with watch_backend_ports([admin]) as seen:
        exercise(url, "tls")
        exercise_celery(url, "tls")  # the Celery transport and result backend too
        exercise_dramatiq(url, "tls")  # and the Dramatiq broker and result backend
    # Every connection of the backend (commands and Pub/Sub) used the TLS port.
    assert {port for _, port in seen} == {tls_server.tls_port}
    assert {kind for kind, _ in seen} == {"command", "wake"}
    admin.close()


@pytest.mark.parametrize(
    "query",
    ["ssl_cert_reqs=none", "ssl_ca_certs={ca}&ssl_certfile={cert}&ssl_keyfile={key}"],
    ids=["unverified", "client-certificate"],
)
@pytest.mark.parametrize("scheme", ["rediss", "valkeys"])
def test_tls_url_options_pass_through(tls_server, certificates, query, scheme):
    query = query.format(
        ca=certificates / "ca.crt",
        cert=certificates / "client.crt",
        key=certificates / "client.key",
    )
    url = tls_server.url(query, scheme)
    namespace = f"tls-{scheme}"
    core = RedisBrokerCore(RedisRunner(url, namespace=namespace), owns_runner=True)
    message_id = core.write("jobs", "secret over TLS")
    assert core.claim_one("jobs") == ("secret over TLS", message_id)
    redis_backend_plugin.cleanup_target(url, backend_options={"namespace": namespace})
    core.shutdown()


def test_tls_target_in_broker_toml(tls_server, certificates, tmp_path):
    project = write_project(
        tmp_path, tls_server.url(f"ssl_ca_certs={certificates / 'ca.crt'}"), "tlscli"
    )
    assert broker_cli(project, "write", "jobs", "over tls").returncode == 0
    read = broker_cli(project, "read", "jobs")
    assert (read.returncode, read.stdout.strip()) == (0, "over tls"), read.stderr


@pytest.mark.parametrize(
    ("scheme", "query", "expected"),
    [
        ("rediss", "ssl_ca_certs={other}", "certificate verify failed"),
        ("rediss", "", "certificate verify failed"),
        ("redis", "", "cannot reach"),
    ],
    ids=["wrong-ca", "system-cas", "plain-to-tls-port"],
)
def test_tls_failures_are_clear_and_redacted(tls_server, certificates, scheme, query, expected):
    url = tls_server.url(
        query.format(other=certificates / "other-ca.crt"), scheme, userinfo=f":{QUOTED}@"
    )
    runner = RedisRunner(url, namespace="tlsfail", pool_timeout=5)
    with pytest.raises(OperationalError) as info:
        runner.ensure_initialized()
    assert expected in str(info.value)
    # A failed verification is final: nothing waits for it to fix itself.
    assert isinstance(info.value, AccessDenied) == (scheme == "rediss"), repr(info.value)
    assert_secret_free(texts_of(info.value))
    runner.shutdown()


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("ssl_ca_certs={other}", "certificate verify failed"),
        ("ssl_ca_certs={missing}", "a file named by ssl_ca_certs, ssl_certfile or ssl_keyfile"),
    ],
    ids=["wrong-ca", "missing-ca-file"],
)
def test_the_cli_reports_a_tls_failure_at_once(tls_server, certificates, tmp_path, query, expected):
    """Not after SimpleBroker's 6 s of connection retries."""
    url = tls_server.url(
        query.format(other=certificates / "other-ca.crt", missing=tmp_path / "no-ca.pem")
    )
    project = write_project(tmp_path, url, "tlsfast")
    started = time.monotonic()
    result = broker_cli(project, "write", "jobs", "x")
    assert result.returncode != 0 and expected in result.stderr, result.stderr
    assert time.monotonic() - started < 5.0


def test_a_tls_hostname_mismatch_is_a_connection_error_of_the_celery_transport(
    tls_binary, tls_files, certificates, make_server
):
    """As with Celery's Redis transport: ``redis.ConnectionError``, which kombu retries.

    The certificate names 127.0.0.1 and localhost; the server also listens
    on 127.0.0.2, which the certificate does not name.
    """
    from kombu import Connection

    import celery_simplebroker  # noqa: F401 - registers the transport
    from celery_simplebroker import ServerUnreachable

    port = free_port()
    make_server(
        "tls-other-name",
        extra_args=["--tls-port", str(port), *tls_files.args(), "--bind", "127.0.0.1", "127.0.0.2"],
        binary=tls_binary,
    )
    url = f"simplebroker+rediss://127.0.0.2:{port}/0?ssl_ca_certs={certificates / 'ca.crt'}"
    with Connection(url, transport_options={"namespace": "tls-mismatch"}) as conn:
        with pytest.raises(redis.ConnectionError) as raised:
            conn.connect()
        assert raised.type is ServerUnreachable
        assert raised.type in conn.transport.connection_errors
        assert "mismatch" in str(raised.value)
