"""Shared test helpers: backend-parametrized contract fixtures and stored-state views.

Tests that take ``sb`` (or ``open_core``) run twice: on the redis backend
and on SimpleBroker's own SQLite ``BrokerCore``. The SQLite run proves that
an expected value encodes SimpleBroker's reference behaviour rather than our
reading of it. Redis-only tests use the ``broker`` and ``raw`` fixtures of
``conftest.py`` and :func:`stored` to check the exact keys a script left.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import redis
from simplebroker import open_broker, resolve_config
from simplebroker.ext import BrokerConnection

from simplebroker_redis import RedisRunner
from simplebroker_redis.core import RedisBrokerCore
from simplebroker_redis.keys import Keyspace, member

#: Short names of the fixed keys whose content :func:`stored` decodes.
SHORT_NAMES = tuple(key.rsplit(":", 1)[1] for key in Keyspace.for_namespace("x").fixed_keys)


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


#: Fixed keys that record what happened rather than what is stored.
OPERATIONS_KEYS = frozenset({"counters", "workers"})


def stored(raw: redis.Redis, namespace: str) -> dict[str, Any]:
    """Return every fixed key of ``namespace`` that exists, decoded by type.

    Sorted sets become lists of members (lex order, as stored), except ``due``
    and ``leases`` whose scores matter; hashes become dicts. The operations
    keys (``counters``, ``workers``) are left out: they say what happened,
    not what is stored, and tests/ops checks them.
    """
    keys = Keyspace.for_namespace(namespace)
    out: dict[str, Any] = {}
    for name, key in zip(SHORT_NAMES, keys.fixed_keys, strict=True):
        if name in OPERATIONS_KEYS:
            continue
        kind = raw.type(key)
        if kind == "zset":
            if name in ("due", "leases"):
                out[name] = dict(raw.zrange(key, 0, -1, withscores=True))
            else:
                out[name] = raw.zrange(key, 0, -1)
        elif kind == "hash":
            out[name] = raw.hgetall(key)
        elif kind != "none":
            out[name] = kind
    return out


def without_meta(state: dict[str, Any]) -> dict[str, Any]:
    """Return ``state`` without the meta record (checked separately)."""
    return {name: value for name, value in state.items() if name != "meta"}


def members(queue: str, *ids: int) -> list[str]:
    """Return the sorted-set members that place ``ids`` in ``queue``, in stored order."""
    return sorted(member(queue, message_id) for message_id in ids)


def body_map(pairs: dict[int, str]) -> dict[str, str]:
    """Return the ``bodies`` hash content for ``{id: body}``."""
    return {f"{message_id:019d}": body for message_id, body in pairs.items()}


def record_scripts(runner: Any) -> list[str]:
    """Record the name of every script run through an AsyncRedisRunner (one round trip each)."""
    names: list[str] = []
    run = runner.run

    async def recording(call: Any) -> Any:
        if call.script is not None:
            names.append(call.script)
        return await run(call)

    runner.run = recording
    return names
