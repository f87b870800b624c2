"""Fixtures of the fault suite: a private server per module that tests may pause or reconfigure.

Also what the TLS tests share: throwaway certificates and a TLS-capable
server binary (the bundled Valkey is built without TLS). Private servers a
test may kill and restart come from ``make_server`` (``tests/conftest.py``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from simplebroker_redis.devserver import DevServer, TlsFiles, free_port, server_binary


@pytest.fixture(scope="module")
def module_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevServer]:
    """A private server shared by one module (tests may pause, reconfigure or DEBUG SLEEP it)."""
    folder = str(tmp_path_factory.mktemp("faults-server"))
    with DevServer(data_dir=folder, extra_args=["--enable-debug-command", "yes"]) as server:
        yield server


@pytest.fixture
def module_raw(module_server: DevServer) -> Iterator[redis.Redis]:
    """A plain client on the module's private server."""
    client = redis.Redis.from_url(module_server.url, decode_responses=True)
    yield client
    client.close()


# -- TLS ---------------------------------------------------------------------------------

#: Set (CI does) to make a missing TLS-capable server fail the TLS tests, not skip them.
REQUIRE_TLS_ENV = "SIMPLEBROKER_REDIS_REQUIRE_TLS"


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="session")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A throwaway CA, a server and a client certificate for 127.0.0.1, and another CA.

    Files: ``ca.crt``, ``server.crt``/``.key``, ``client.crt``/``.key`` (both
    signed by ``ca.crt``) and ``other-ca.crt`` (signs nothing here).
    """
    where = tmp_path_factory.mktemp("tls")
    curve = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    # The extensions a strict verifier asks for (Python 3.13 sets VERIFY_X509_STRICT
    # by default): key usage on the CA, key identifiers and usages on the leaves.
    ca_extensions = ("-addext", "basicConstraints=critical,CA:TRUE",
                     "-addext", "keyUsage=critical,keyCertSign,cRLSign")  # fmt: skip
    for name, subject in (("ca", "simplebroker-redis test CA"), ("other-ca", "someone else")):
        _openssl(
            "req", "-x509", *curve, "-keyout", f"{name}.key", "-out", f"{name}.crt",
            "-days", "2", "-subj", f"/CN={subject}", *ca_extensions, cwd=where,
        )  # fmt: skip
    (where / "leaf.ext").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
        "basicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature\n"
        "extendedKeyUsage=serverAuth,clientAuth\n"
        "subjectKeyIdentifier=hash\n"
        "authorityKeyIdentifier=keyid,issuer\n"
    )
    for name in ("server", "client"):
        _openssl(
            "req", *curve, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}",
            cwd=where,
        )  # fmt: skip
        _openssl(
            "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile", "leaf.ext",
            cwd=where,
        )  # fmt: skip
    return where


@pytest.fixture(scope="session")
def tls_files(certificates: Path) -> TlsFiles:
    """The server side of :func:`certificates`, as the dev topologies take it."""
    return TlsFiles(
        cert_file=str(certificates / "server.crt"),
        key_file=str(certificates / "server.key"),
        ca_file=str(certificates / "ca.crt"),
    )


def _tls_capable_candidates() -> list[str]:
    """The configured server first, then servers on PATH (the bundled Valkey has no TLS)."""
    found = [server_binary(), shutil.which("redis-server"), shutil.which("valkey-server")]
    return list(dict.fromkeys(path for path in found if path))


@pytest.fixture(scope="session")
def tls_binary(tls_files: TlsFiles, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The first candidate server binary that starts with a TLS port.

    None: skip, or fail when ``$SIMPLEBROKER_REDIS_REQUIRE_TLS`` is set (CI
    installs redis-server, so there the TLS tests always run).
    """
    args = ["--tls-port", str(free_port()), *tls_files.args()]
    refused = []
    for binary in _tls_capable_candidates():
        probe = DevServer(
            data_dir=str(tmp_path_factory.mktemp("tls-probe")), extra_args=args, binary=binary
        )
        try:
            probe.start()
        except RuntimeError:
            log = Path(probe.data_dir, "server.log").read_text(errors="replace")
            refused.append(f"{binary}: {log.strip().splitlines()[-1:]}")
            continue
        finally:
            probe.stop()
        return binary
    message = (
        f"no server binary with TLS support: {refused}; to run these tests install "
        "Debian's redis-server or set SIMPLEBROKER_REDIS_SERVER to a TLS-capable server"
    )
    if os.environ.get(REQUIRE_TLS_ENV):
        pytest.fail(message)
    # A machine with only Python and the dev extras has the bundled Valkey,
    # which is built without TLS: nothing to test TLS against.
    pytest.skip(message)
