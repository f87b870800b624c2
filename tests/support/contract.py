"""Contract fixtures: a test that takes ``sb`` (or ``open_core``) runs on two backends.

Once on this backend and once on SimpleBroker's own SQLite ``BrokerCore``:
the SQLite run proves that an expected value encodes SimpleBroker's
reference behaviour rather than our reading of it. ``tests/conftest.py``
makes these fixtures available to every test.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from simplebroker import open_broker, resolve_config
from simplebroker.ext import BrokerConnection

from simplebroker_redis import RedisRunner
from simplebroker_redis.core import RedisBrokerCore


@pytest.fixture(params=["redis", "sqlite"])
def backend_kind(request: pytest.FixtureRequest) -> str:
    """Name of the backend a contract test runs on."""
    return str(request.param)


@pytest.fixture
def open_core(
    backend_kind: str, redis_url: str, namespace: str, tmp_path: Path
) -> Iterator[Callable[..., BrokerConnection]]:
    """Factory: open another handle on this test's broker; kwargs override config.

    ``open_core(MAX_MESSAGE_SIZE=8)`` sets ``BROKER_MAX_MESSAGE_SIZE`` for that handle.
    """
    stack = ExitStack()

    def factory(**config: object) -> BrokerConnection:
        overrides = {f"BROKER_{name}": value for name, value in config.items()}
        resolved = resolve_config(override=overrides) if overrides else None
        if backend_kind == "redis":
            runner = RedisRunner(redis_url, namespace=namespace)
            handle = RedisBrokerCore(runner, config=resolved, owns_runner=True)
            stack.callback(handle.shutdown)
            return handle
        path = os.fspath(tmp_path / "reference.db")
        handle = stack.enter_context(open_broker(path, config=resolved))
        return handle

    with stack:
        yield factory


@pytest.fixture
def sb(open_core: Callable[..., BrokerConnection]) -> BrokerConnection:
    """A handle of the parametrized backend, automatic vacuum off (exact counts)."""
    return open_core(AUTO_VACUUM=0)
