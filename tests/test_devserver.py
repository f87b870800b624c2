"""DevServer picks its own port safely and survives losing it to another process."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from simplebroker_redis.devserver import DevServer, free_port, free_ports
from simplebroker_redis.devserver._server import PORT_RANGE, _ephemeral_low


@pytest.fixture
def squatter() -> Iterator[socket.socket]:
    """A listening socket on a port of the dev range: what another process would hold."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", free_port()))
    sock.listen()
    yield sock
    sock.close()


def test_free_ports_are_distinct_bindable_and_below_the_ephemeral_range() -> None:
    ports = free_ports(40)

    assert len(set(ports)) == 40
    assert all(PORT_RANGE[0] <= port < min(PORT_RANGE[1], _ephemeral_low()) for port in ports)
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))


def test_a_port_taken_before_the_server_binds_moves_the_server(
    tmp_path: Path, squatter: socket.socket
) -> None:
    server = DevServer(data_dir=str(tmp_path / "moved"))
    taken = squatter.getsockname()[1]
    server.port = taken  # as if another process bound it between choice and start

    with server:
        assert server.port != taken
        client = redis.Redis.from_url(server.url)
        assert client.ping() and client.set("k", "v")
        assert client.info("server")["process_id"] == server.process.pid  # type: ignore[union-attr]
        client.close()
    log = (tmp_path / "moved" / "server.log").read_text()
    assert "Address already in use" in log


def test_a_port_given_by_the_caller_is_never_moved(tmp_path: Path, squatter: socket.socket) -> None:
    taken = squatter.getsockname()[1]
    server = DevServer(data_dir=str(tmp_path / "fixed"), port=taken)

    with pytest.raises(RuntimeError, match="exited early; see .*fixed/server.log"):
        server.start()
    assert server.port == taken
