"""Namespace lifecycle: create, validate and delete one namespace of a server.

Also the durable high-water mark reads behind the plugin's timestamp hooks.
"""

from __future__ import annotations

from typing import Any, Final

from simplebroker.ext import DatabaseError, DataError

from . import calls
from .keys import ID_WIDTH, MAGIC
from .runner import RedisRunner, release_shared_runners

#: Oldest server major version with every command the scripts use.
MIN_SERVER_MAJOR: Final[int] = 7

_SCAN_COUNT: Final[int] = 1000


def check_server_version(runner: RedisRunner) -> None:
    """Refuse servers older than Redis/Valkey 7 with a clear error."""
    info = runner.execute(lambda client: client.info("server"), idempotent=True)
    version = str(info.get("valkey_version") or info.get("redis_version") or "0")
    major = int(version.split(".")[0] or 0)
    if major < MIN_SERVER_MAJOR:
        raise DatabaseError(
            f"{runner.where} runs server version {version}; simplebroker-redis "
            "needs Valkey 7+ or Redis 7+"
        )


def _first_namespace_key(runner: RedisRunner) -> str | None:
    pattern = runner.keys.scan_pattern

    def scan(client: Any) -> str | None:
        for key in client.scan_iter(match=pattern, count=_SCAN_COUNT):
            return str(key)
        return None

    result: str | None = runner.execute(scan, idempotent=True)
    return result


def initialize(runner: RedisRunner) -> None:
    """Create the namespace meta record unless it exists (idempotent).

    A namespace without meta that already holds keys under our prefix is
    refused: it was not made by this product, or was damaged.
    """
    if runner.run(calls.init("check")) == "ready":
        return
    stray = _first_namespace_key(runner)
    if stray is not None:
        raise DatabaseError(
            f"{runner.where} holds key {stray!r} but no simplebroker-redis meta "
            "record; refusing to adopt a namespace this product did not create"
        )
    runner.run(calls.init("init"))


def validate(runner: RedisRunner, *, verify_initialized: bool) -> None:
    """Check meta and schema version (one round trip, none once this process knows).

    SimpleBroker asks before every operation of a project-scoped ``Queue``;
    once this process has created or validated the namespace, the answer is
    known: every writing script checks the namespace again itself (and
    creates it again if it was cleaned up meanwhile), and a read of a
    missing namespace finds nothing, as on an empty one.
    """
    if runner.initialized:
        return
    if runner.run(calls.init("check")) == "absent":
        if verify_initialized:
            raise DatabaseError(f"{runner.where} is not initialized")
        return
    runner.mark_initialized()


def cleanup(runner: RedisRunner) -> bool:
    """Delete exactly this namespace's keys; return whether any existed.

    Refuses (before deleting anything) when the meta record belongs to
    something else. Never runs FLUSHDB or FLUSHALL.
    """
    keys = runner.keys

    def meta_kind(client: Any) -> tuple[str, Any]:
        kind = str(client.type(keys.meta))
        return kind, (client.hget(keys.meta, "magic") if kind == "hash" else None)

    kind, magic = runner.execute(meta_kind, idempotent=True)
    if kind != "none" and (kind != "hash" or magic != MAGIC):
        raise DatabaseError(
            f"{runner.where} meta record is not a simplebroker-redis namespace; "
            "refusing to delete it"
        )
    deleted = runner.run(calls.cleanup())

    def sweep(client: Any) -> int:
        count = 0
        batch: list[str] = []
        for key in client.scan_iter(match=keys.scan_pattern, count=_SCAN_COUNT):
            batch.append(key)
            if len(batch) >= _SCAN_COUNT:
                count += int(client.unlink(*batch))
                batch.clear()
        if batch:
            count += int(client.unlink(*batch))
        return count

    deleted += int(runner.execute(sweep))
    release_shared_runners(keys.namespace)
    return deleted > 0


def _meta_field(runner: RedisRunner, name: str) -> str | None:
    key = runner.keys.meta
    value = runner.execute(lambda client: client.hget(key, name), idempotent=True)
    return None if value is None else str(value)


def read_last_ts(runner: RedisRunner) -> int:
    """Return the durable high-water mark (0 for an empty namespace)."""
    value = _meta_field(runner, "last_ts")
    if value is None:
        return 0
    if not (len(value) == ID_WIDTH and value.isascii() and value.isdigit()):
        raise DataError(
            f"damaged simplebroker-redis data in {runner.where}: "
            f"last_ts is not a {ID_WIDTH}-digit message ID"
        )
    return int(value)


def read_meta_int(runner: RedisRunner, name: str) -> int:
    """Return an integer field of the meta record (0 when absent)."""
    return int(_meta_field(runner, name) or 0)


def read_magic(runner: RedisRunner) -> str | None:
    """Return the namespace magic string, or None."""
    return _meta_field(runner, "magic")
