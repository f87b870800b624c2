"""Lua scripts: one ``.lua`` file per atomic operation, shipped in the wheel.

Each script is ``lua/_lib.lua`` (shared helpers and the KEYS layout) followed
by its operation file. redis-py's ``register_script`` hashes the source once
and runs it with EVALSHA, loading it again after a NOSCRIPT reply (for
example after ``SCRIPT FLUSH`` or a server restart).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, fields
from functools import cache
from importlib import resources
from typing import Any, Literal, Protocol, get_args


class _Registers(Protocol):
    def register_script(self, script: str) -> Any: ...


#: Names of the operation scripts (``lua/<name>.lua``).
ScriptName = Literal[
    "init",
    "cleanup",
    "advance_ts",
    "stamp",
    "resync",
    "write",
    "insert",
    "broadcast",
    "claim",
    "peek",
    "reserve",
    "settle",
    "release",
    "renew",
    "recover",
    "delete_queues",
    "delete_ids",
    "rename",
    "alias_add",
    "alias_remove",
    "vacuum",
    "stats",
    "probe",
    "find",
]

SCRIPT_NAMES: tuple[str, ...] = get_args(ScriptName)


@cache
def script_source(name: str) -> str:
    """Return the full source of script ``name`` (library prelude included)."""
    package = resources.files("simplebroker_redis") / "lua"
    library = (package / "_lib.lua").read_text(encoding="utf-8")
    body = (package / f"{name}.lua").read_text(encoding="utf-8")
    return f"{library}\n-- ==== {name}.lua ====\n{body}"


@cache
def script_sha(name: str) -> str:
    """Return the SHA1 that EVALSHA uses for script ``name``.

    For callers that pipeline scripts by hand (a redis-py ``Script`` in a
    pipeline costs an extra SCRIPT EXISTS round trip); on NOSCRIPT they fall
    back to :meth:`RedisRunner.call`, which loads the script.
    """
    return hashlib.sha1(script_source(name).encode("utf-8")).hexdigest()


@dataclass(frozen=True, slots=True)
class Scripts:
    """The registered scripts of one client (sync ``Script`` or ``AsyncScript``).

    One attribute per operation; see each ``lua/<name>.lua`` header for its
    arguments and result.
    """

    init: Any
    cleanup: Any
    advance_ts: Any
    stamp: Any
    resync: Any
    write: Any
    insert: Any
    broadcast: Any
    claim: Any
    peek: Any
    reserve: Any
    settle: Any
    release: Any
    renew: Any
    recover: Any
    delete_queues: Any
    delete_ids: Any
    rename: Any
    alias_add: Any
    alias_remove: Any
    vacuum: Any
    stats: Any
    probe: Any
    find: Any

    @classmethod
    def register(cls, client: _Registers) -> Scripts:
        """Register every script with ``client`` (no server round trip)."""
        return cls(
            **{
                field.name: client.register_script(script_source(field.name))
                for field in fields(cls)
            }
        )
