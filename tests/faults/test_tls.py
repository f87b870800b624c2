"""TLS: ``rediss://`` against a server started with a throwaway certificate.

The certificates (a CA, a server certificate for 127.0.0.1, a client
certificate) are made by ``openssl`` for the test. The bundled Valkey is
built without TLS, so the server is the first TLS-capable binary among the
configured one and those on PATH.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from simplebroker.ext import OperationalError

from simplebroker_redis import RedisRunner, redis_backend_plugin
from simplebroker_redis.core import RedisBrokerCore
from simplebroker_redis.devserver import DevServer, free_port, server_binary

from .exercise import exercise, exercise_celery
from .support import QUOTED, assert_secret_free, broker_cli, texts_of, write_project


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A throwaway CA, a server certificate for 127.0.0.1, and a client certificate."""
    where = tmp_path_factory.mktemp("tls")
    curve = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl(
        "req",
        "-x509",
        *curve,
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "2",
        "-subj",
        "/CN=simplebroker-redis test CA",
        cwd=where,
    )
    (where / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name in ("server", "client"):
        _openssl(
            "req",
            *curve,
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.csr",
            "-subj",
            f"/CN={name}",
            cwd=where,
        )
        _openssl(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            f"{name}.crt",
            "-days",
            "2",
            "-extfile",
            "san.ext",
            cwd=where,
        )
    _openssl(
        "req",
        "-x509",
        *curve,
        "-keyout",
        "other-ca.key",
        "-out",
        "other-ca.crt",
        "-days",
        "2",
        "-subj",
        "/CN=someone else",
        cwd=where,
    )
    return where


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


def _tls_capable_binaries() -> list[str]:
    """The configured server first, then servers on PATH (the bundled Valkey has no TLS)."""
    found = [server_binary(), shutil.which("redis-server"), shutil.which("valkey-server")]
    return list(dict.fromkeys(path for path in found if path))


@pytest.fixture(scope="module")
def tls_server(certificates: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsServer]:
    """Client certificates are optional, so one server serves every TLS test."""
    port = free_port()
    args = [
        "--tls-port", str(port),
        "--tls-cert-file", str(certificates / "server.crt"),
        "--tls-key-file", str(certificates / "server.key"),
        "--tls-ca-cert-file", str(certificates / "ca.crt"),
        "--tls-auth-clients", "optional",
    ]  # fmt: skip
    refused = []
    for binary in _tls_capable_binaries():
        server = DevServer(
            data_dir=str(tmp_path_factory.mktemp("tls-server")), extra_args=args, binary=binary
        )
        try:
            server.start()
        except RuntimeError:
            log = Path(server.data_dir, "server.log").read_text(errors="replace")
            refused.append(f"{binary}: {log.strip().splitlines()[-1:]}")
            server.stop()
            continue
        yield TlsServer(server, port)
        server.stop()
        return
    message = (
        f"no server binary with TLS support: {refused}; to run these tests install "
        "Debian's redis-server or set SIMPLEBROKER_REDIS_SERVER to a TLS-capable server"
    )
    if os.environ.get("SIMPLEBROKER_REDIS_REQUIRE_TLS"):
        pytest.fail(message)  # CI installs redis-server so these tests always run there
    # A machine with only Python and the dev extras has the bundled Valkey,
    # which is built without TLS: nothing to test TLS against.
    pytest.skip(message)


def test_every_operation_over_verified_tls(tls_server, certificates):
    url = tls_server.url(f"ssl_ca_certs={certificates / 'ca.crt'}")
    admin = redis.Redis.from_url(tls_server.admin_url, decode_responses=True)
    ports: set[str] = set()
    done = threading.Event()

    def watch_ports() -> None:
        while not done.is_set():
            for client in admin.client_list():
                if client.get("name", "").startswith("simplebroker-redis:"):
                    ports.add(client["laddr"].rsplit(":", 1)[1])
            done.wait(0.05)

    watcher = threading.Thread(target=watch_ports, daemon=True)
    watcher.start()
    try:
        exercise(url, "tls")
        exercise_celery(url, "tls")  # the Celery transport and result backend too
    finally:
        done.set()
        watcher.join(10)
    # Every connection of the backend (commands and Pub/Sub) used the TLS port.
    assert ports == {str(tls_server.tls_port)}
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
    assert_secret_free(texts_of(info.value))
    runner.shutdown()
