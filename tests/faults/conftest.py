"""Fixtures of the fault suite: private servers that tests may kill, pause or reconfigure."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from simplebroker_redis.devserver import DevServer

ServerFactory = Callable[..., DevServer]


def _stop_all(servers: list[DevServer]) -> None:
    for server in servers:
        try:
            server.stop()
        except Exception:  # noqa: BLE001 - teardown must stop every server
            pass


@pytest.fixture
def make_server(tmp_path: Path) -> Iterator[ServerFactory]:
    """Factory: start a private server (own port and data dir); all stopped after the test.

    ``make_server(name, appendonly=..., extra_args=[...], port=...)``; the
    same ``name`` reuses the data directory, so a restart reloads its files.
    """
    servers: list[DevServer] = []

    def factory(name: str = "srv", **kwargs: Any) -> DevServer:
        server = DevServer(data_dir=str(tmp_path / name), **kwargs)
        servers.append(server)
        return server.start()

    yield factory
    _stop_all(servers)


@pytest.fixture(scope="module")
def module_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevServer]:
    """A private server shared by one module (tests may pause, reconfigure or DEBUG SLEEP it)."""
    server = DevServer(
        data_dir=str(tmp_path_factory.mktemp("faults-server")),
        extra_args=["--enable-debug-command", "yes"],
    )
    server.start()
    yield server
    server.stop()


@pytest.fixture
def module_raw(module_server: DevServer) -> Iterator[redis.Redis]:
    """A plain client on the module's private server."""
    client = redis.Redis.from_url(module_server.url, decode_responses=True)
    yield client
    client.close()
