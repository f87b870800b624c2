"""Lua scripts: one ``.lua`` file per atomic operation, shipped in the wheel.

Each script is ``lua/_lib.lua`` (shared helpers and the KEYS layout) followed
by its operation file. redis-py's ``register_script`` hashes the source once
and runs it with EVALSHA, loading it again after a NOSCRIPT reply (for
example after ``SCRIPT FLUSH`` or a server restart).
"""

from __future__ import annotations

import hashlib
import re
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
    "write_batch",
    "insert",
    "broadcast",
    "claim",
    "peek",
    "reserve",
    "settle",
    "commit",
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


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DEFINITION = re.compile(r"^local (?:function (\w+)|([\w, ]+?) =)")


@dataclass(frozen=True, slots=True)
class _Block:
    """One top-level definition of ``_lib.lua`` with its leading comments."""

    text: str
    defines: frozenset[str]
    uses: frozenset[str]


@cache
def _library() -> tuple[_Block, ...]:
    text = (resources.files("simplebroker_redis") / "lua" / "_lib.lua").read_text("utf-8")
    blocks: list[list[str]] = [[]]
    comments: list[str] = []
    for line in text.splitlines():
        if line.startswith("local "):
            blocks.append([*comments, line])
            comments = []
        elif line.startswith("--") or not line.strip():
            comments.append(line)
        else:
            blocks[-1].extend([*comments, line])
            comments = []
    out = []
    for lines in blocks:
        defines: set[str] = set()
        for line in lines:
            match = _DEFINITION.match(line)
            if match:
                names = match.group(1) or match.group(2)
                defines.update(name.strip() for name in names.split(","))
        body = "\n".join(lines)
        uses = frozenset(_IDENTIFIER.findall(body)) - defines
        out.append(_Block(body, frozenset(defines), uses))
    return tuple(out)


@cache
def script_source(name: str) -> str:
    """Return the source of script ``name``: the library parts it needs, then its body.

    Every script runs the whole prelude on each call, so only the library
    definitions the script (transitively) uses are included; that keeps the
    per-call cost of small scripts low. Order is the library's own.
    """
    body = (resources.files("simplebroker_redis") / "lua" / f"{name}.lua").read_text("utf-8")
    blocks = _library()
    wanted = set(_IDENTIFIER.findall(body))
    changed = True
    while changed:
        changed = False
        for block in blocks:
            if block.defines & wanted and not block.uses <= wanted:
                wanted |= block.uses
                changed = True
    parts = [block.text for block in blocks if not block.defines or block.defines & wanted]
    return "\n".join([*parts, f"-- ==== {name}.lua ====", body])


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
    write_batch: Any
    insert: Any
    broadcast: Any
    claim: Any
    peek: Any
    reserve: Any
    settle: Any
    commit: Any
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
