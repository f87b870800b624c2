"""DevServer picks its own port safely and survives losing it to another process.

The command line (``make server``) never passes another server off as its
own, and says so when its server stops without being asked to.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from simplebroker_redis.devserver import DevServer, PortInUse, free_port, free_ports
from simplebroker_redis.devserver import _server as devserver_module
from simplebroker_redis.devserver._server import PORT_RANGE, _ephemeral_low
from support.waiting import wait_for

#: The dev server's command line, as ``make server`` runs it.
CLI = [sys.executable, "-m", "simplebroker_redis.devserver"]


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

    with pytest.raises(PortInUse, match=f"port {taken} on 127.0.0.1 is already in use"):
        server.start()
    assert server.port == taken and server.process is None


def _pid_of(server: DevServer) -> int:
    client = redis.Redis(port=server.port)
    try:
        return int(client.info("server")["process_id"])
    finally:
        client.close()


def test_a_chosen_port_another_server_holds_is_never_taken_for_ours(
    tmp_path: Path, make_server: Callable[..., DevServer]
) -> None:
    """Another server answers PING on a port ours lost: ours moves, it is never that one."""
    other = make_server("other")
    server = DevServer(data_dir=str(tmp_path / "moved"))
    server.port = other.port  # as if the other server bound it between choice and start

    with server:
        assert server.port != other.port
        assert _pid_of(server) == server.process.pid  # type: ignore[union-attr]
    assert _pid_of(other) == other.process.pid  # type: ignore[union-attr] # untouched


def test_a_given_port_another_server_binds_after_the_check_fails_loudly(
    tmp_path: Path, make_server: Callable[..., DevServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other server answers PING first; ours fails to bind: PortInUse, never its URL."""
    other = make_server("other")
    # As if the other server bound the port between the check and our bind.
    monkeypatch.setattr(devserver_module, "port_in_use", lambda port: False)
    server = DevServer(data_dir=str(tmp_path / "late"), port=other.port)

    with pytest.raises(PortInUse, match=f"in use by another server \\(pid {other.process.pid}"):
        server.start()
    assert server.process is None


def test_the_cli_refuses_a_port_another_server_holds(
    tmp_path: Path, make_server: Callable[..., DevServer]
) -> None:
    other = make_server("other")
    started = time.monotonic()
    result = subprocess.run(
        [*CLI, "--dir", str(tmp_path / "mine"), "--port", str(other.port)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1, result
    assert result.stdout == ""  # never the URL of a server it did not start
    assert f"port {other.port} on 127.0.0.1 is already in use" in result.stderr, result.stderr
    assert "--port" in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert time.monotonic() - started < 10  # at once: no wait for a server to answer
    assert _pid_of(other) == other.process.pid  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("how", "said", "code"),
    [(signal.SIGKILL, "killed by SIGKILL", 1), (None, "exited with code 0", 0)],
    ids=["kill-9", "shutdown"],
)
def test_the_cli_says_how_its_server_stopped(
    tmp_path: Path, how: signal.Signals | None, said: str, code: int
) -> None:
    """A server that stops unasked (kill -9, a SHUTDOWN command) ends the CLI with a reason."""
    url_file = tmp_path / "url"
    cli = subprocess.Popen(
        [*CLI, "--dir", str(tmp_path / "data"), "--url-file", str(url_file)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(url_file.exists, 30, "the server's URL")
        client = redis.Redis.from_url(url_file.read_text().strip())
        pid = int(client.info("server")["process_id"])
        if how is None:
            client.shutdown(nosave=True)
        else:
            os.kill(pid, how)
        client.close()
        out, err = cli.communicate(timeout=30)
    finally:
        cli.kill()
        cli.wait()
    assert cli.returncode == code, (out, err)
    assert out.startswith("redis://127.0.0.1:"), out
    assert f"the server (pid {pid}) stopped: {said}; see " in err, err
    assert "server.log" in err and "Traceback" not in err, err
