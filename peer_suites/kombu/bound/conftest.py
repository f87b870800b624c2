"""Fixtures binding kombu's integration tests to one transport (``$PEER_TRANSPORT``).

``peer_suites/kombu/run.py`` copies this directory next to kombu's ``t/`` (from
its sdist or a checkout) and runs it twice on one server it started: once
with kombu's own ``redis://`` transport, once with ``simplebroker+redis://``.
The fixtures are the ones kombu's ``t/integration/test_redis.py`` and
``test_py_amqp.py`` define, with the URL of the transport under test.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import kombu
import pytest
import redis

import celery_simplebroker  # noqa: F401 - registers the simplebroker transports

#: "redis" (kombu's transport) or "simplebroker" (ours).
TRANSPORT = os.environ.get("PEER_TRANSPORT", "simplebroker")
HOST = "127.0.0.1"
PORT = int(os.environ["PEER_PORT"])  # the server run.py started
DEAD_PORT = int(os.environ["PEER_DEAD_PORT"])  # a port nothing listens on
#: Database of the redis:// run (emptied before each of its tests: run.py's own server).
REDIS_DB = 1


def url(
    port: int = PORT,
    user: str | None = None,
    password: str | None = None,
    *,
    tls: bool = False,
) -> str:
    """Return the broker URL of the transport under test (with ``tls``: no database)."""
    credentials = f"{user}:{password}@" if user else ""
    scheme = "rediss" if tls else "redis"
    if TRANSPORT != "redis":
        scheme = f"simplebroker+{scheme}"
    database = "" if tls else f"/{REDIS_DB if TRANSPORT == 'redis' else 0}"
    return f"{scheme}://{credentials}{HOST}:{port}{database}"


def options(**extra: Any) -> dict[str, Any]:
    """Return transport options: a namespace of its own for each of our connections."""
    if TRANSPORT == "redis":
        return dict(extra)
    return {"namespace": f"kombu-peer-{uuid.uuid4().hex[:12]}", **extra}


@pytest.fixture(autouse=True)
def _empty_database() -> Iterator[None]:
    """Give each redis:// test an empty database (ours get a new namespace instead)."""
    if TRANSPORT == "redis":
        client = redis.Redis(host=HOST, port=PORT, db=REDIS_DB)
        client.flushdb()
        client.close()
    yield


@pytest.fixture
def transport_options() -> dict[str, Any]:
    """Transport options of this test's connections (priority tests add their order)."""
    return options()


@pytest.fixture
def connection(transport_options: dict[str, Any]) -> kombu.Connection:
    """Return a connection to the server (kombu's ``connection`` fixture)."""
    return kombu.Connection(url(), transport_options=transport_options)


@pytest.fixture
def invalid_connection() -> kombu.Connection:
    """Return a connection to a port nothing listens on."""
    return kombu.Connection(url(DEAD_PORT), transport_options=options())


@pytest.fixture
def failover_connection(transport_options: dict[str, Any]) -> kombu.Connection:
    """Return a dead first URL, then the live one (kombu's ``failover_connection``)."""
    return kombu.Connection(f"{url(DEAD_PORT)};{url()}", transport_options=transport_options)
