"""Lua scripts: one ``.lua`` file per atomic operation, shipped in the wheel.

Every operation is assembled from three parts:

1. the *prelude*, generated here from :mod:`.keys`: the constants (magic,
   schema version, ID width), the key types, and ``bind()``, which names the
   fixed ``KEYS`` ``K_<NAME>`` for the call at hand; those are defined once,
   in Python;
2. the shared modules under ``lua/lib/`` that an operation declares on a
   ``-- uses: a, b`` header line, each with the modules *it* declares, in
   dependency order;
3. the operation file ``lua/<name>.lua`` itself.

A framework's scripts and modules live in a room of their own,
``lua/<room>/`` and ``lua/<room>/lib/`` (:data:`ROOMS`: ``celery``,
``taskiq``, ``dramatiq``), so the core's folder holds only the core's; they
are assembled and loaded exactly as the core's, into the same library.

Nothing is discovered: a module is included because a header names it, and
``tests/test_lua_modules.py`` fails when a file uses a helper it did not
declare.

The parts run on the server in one of two forms (backend option
``scripting``):

- ``"functions"`` (the default): one Redis Functions library
  (:func:`library`) holds the prelude, every module and one function per
  operation. The server loads it once (``FUNCTION LOAD``) and each call is
  an ``FCALL`` that runs only the operation's body, so defining the helpers
  costs nothing per call. The library and function names carry a hash of
  the library's text, so two package versions on one server each use their
  own. A server that lost the library (restart without persistence, a new
  cluster node) answers "Function not found" and the runner loads it again.
- ``"eval"``: each operation is a script of its own (:func:`script_source`:
  prelude, its declared modules, its body) run by ``EVALSHA``, for servers
  or ACLs that refuse ``FUNCTION LOAD``.

:func:`locate` maps a line of either form (as a server error names it,
``@user_script:<line>`` or ``@user_function:<line>``) back to its file.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Final, Literal, get_args

from ..keys import FIXED_KEYS, ID_WIDTH, MAGIC, MAX_ID, SCHEMA_VERSION

#: Names of the operation scripts (``lua/<name>.lua``); listed only here.
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
    "probe_exists",
    "probe_pending",
    "probe_latest",
    "find",
    "dead_letters",
    "dead_letter_ack",
    "schedule_claim",
    "schedule_sent",
    "schedule_list",
    "reserve_queues",
    "celery_bind",
    "celery_exchange_table",
    "celery_unbind",
    "celery_chord_size",
    "celery_chord_add",
    "celery_chord_part",
    "celery_chord_dispatch",
    "celery_store",
    "depths",
    "inspect",
    "dead_letter_requeue",
    "worker_beat",
    "task_find",
    "running",
    "task_stats",
    "task_stats_read",
    "dramatiq_store",
    "dramatiq_dead",
]

SCRIPT_NAMES: Final[tuple[ScriptName, ...]] = get_args(ScriptName)

#: The frameworks' rooms: the scripts and shared modules of each live in
#: ``lua/<room>/`` and ``lua/<room>/lib/``; everything else is the core's
#: (``lua/``, ``lua/lib/``).
ROOMS: Final[dict[str, tuple[frozenset[str], frozenset[str]]]] = {
    "celery": (
        frozenset(name for name in SCRIPT_NAMES if name.startswith("celery_")),
        frozenset({"celery"}),
    ),
    "taskiq": (frozenset({"schedule_claim", "schedule_sent", "schedule_list"}), frozenset()),
    "dramatiq": (frozenset({"dramatiq_store", "dramatiq_dead"}), frozenset({"dramatiq"})),
}


def _room(name: str, *, module: bool) -> str:
    """Return the folder under ``lua/`` that holds a script or module ('' for the core)."""
    for room, (names, modules) in ROOMS.items():
        if name in (modules if module else names):
            return f"{room}/"
    return ""


def script_file(name: str) -> str:
    """Return the path under ``lua/`` of operation ``name`` (in its room for a framework's)."""
    return f"{_room(name, module=False)}{name}.lua"


def module_file(name: str) -> str:
    """Return the path under ``lua/`` of shared module ``name``."""
    return f"{_room(name, module=True)}lib/{name}.lua"


#: Name of the generated prelude in source maps and error locations.
PRELUDE: Final[str] = "prelude"

_USES_RE: Final = re.compile(r"^-- uses: (.*)$", re.M)


def _read(path: str) -> str:
    return (resources.files("simplebroker_redis") / "lua" / path).read_text("utf-8")


def declared_uses(text: str) -> tuple[str, ...]:
    """Return the modules a Lua file declares on its ``-- uses:`` line."""
    match = _USES_RE.search(text)
    if match is None:
        raise ValueError("Lua file without a '-- uses:' header line")
    value = match.group(1).strip()
    if value.startswith("("):  # "(nothing but the prelude)"
        return ()
    return tuple(name.strip() for name in value.split(","))


@cache
def module_source(name: str) -> str:
    """Return the text of the shared module ``name`` (:func:`module_file`)."""
    return _read(module_file(name))


def _key_names() -> list[str]:
    return [f"K_{name.upper()}" for name, _ in FIXED_KEYS]


def prelude(*, library: bool = False) -> str:
    """Return the generated prelude: constants, key types and ``bind()``.

    ``bind(keys, args)`` names the fixed keys of the call (``K_META`` is
    ``KEYS[1]``, ...) and the wake prefix (``ARGV[1]``). In a script the
    globals ``KEYS`` and ``ARGV`` are the call's; in the library they are
    set by ``bind`` from the function's arguments.
    """
    names = _key_names()
    types = ", ".join(f"{name} = '{kind}'" for name, kind in FIXED_KEYS)
    lines = [
        "-- prelude: generated by simplebroker_redis.scripts from keys.py; do not edit.",
        "local KEYS, ARGV" if library else "local KEYS, ARGV = KEYS, ARGV",
        f"local {', '.join(names)}",
        "local WAKE_PREFIX, KEY_PREFIX_LEN",
        "-- Keys whose type this call has verified (guard.lua: check_keys, verified).",
        "local VERIFIED = {}",
        f"local FIXED_KEYS = {len(names)}",
        f"local MAGIC = '{MAGIC}'",
        f"local SCHEMA = '{SCHEMA_VERSION}'",
        f"local ID_WIDTH = {ID_WIDTH}",
        f"local ZERO_ID = '{0:0{ID_WIDTH}d}'",
        f"local MAX_ID = '{MAX_ID:0{ID_WIDTH}d}'",
        "-- The Redis type of each fixed key, by its name after the namespace prefix.",
        f"local KEY_TYPES = {{{types}}}",
        "",
        "-- Name this call's keys and wake prefix.",
        "local function bind(keys, args)",
        "  KEYS, ARGV, VERIFIED = keys, args, {}",
    ]
    for start in range(0, len(names), 4):
        chunk = names[start : start + 4]
        values = ", ".join(f"KEYS[{start + i + 1}]" for i in range(len(chunk)))
        lines.append(f"  {', '.join(chunk)} = {values}")
    lines += [
        "  WAKE_PREFIX = ARGV[1]",
        f"  KEY_PREFIX_LEN = #K_META - {len('meta')}",
        "end",
        "",
        "-- The Redis type a fixed key must have.",
        "local function key_type(key) return KEY_TYPES[string.sub(key, KEY_PREFIX_LEN + 1)] end",
    ]
    return "\n".join(lines)


@cache
def module_order(name: str) -> tuple[str, ...]:
    """Return the shared modules script ``name`` needs, dependencies first."""
    order: list[str] = []

    def visit(module: str, path: tuple[str, ...]) -> None:
        if module in order:
            return
        if module in path:
            raise ValueError(f"Lua modules declare a cycle: {' -> '.join((*path, module))}")
        for used in declared_uses(module_source(module)):
            visit(used, (*path, module))
        order.append(module)

    for module in declared_uses(script_body(name)):
        visit(module, ())
    return tuple(order)


@cache
def script_body(name: str) -> str:
    """Return the operation file of ``name`` (:func:`script_file`) as written."""
    return _read(script_file(name))


#: Operations that never write: their functions carry the ``no-writes`` flag.
READ_ONLY: Final[frozenset[ScriptName]] = frozenset(
    {
        *("peek", "stats", "probe_exists", "probe_pending", "probe_latest", "find"),
        *("dead_letters", "schedule_list", "depths", "inspect"),
        *("task_find", "running", "task_stats_read"),
    }
)


@dataclass(frozen=True, slots=True)
class _Part:
    file: str  #: "prelude", or a path under lua/ (:func:`module_file`, :func:`script_file`)
    first_line: int  #: line of the assembled source where the part starts (1-based)


class _Assembly:
    """Lua text built from parts, with the line where each part starts."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.parts: list[_Part] = []

    def add(self, file: str, text: str) -> None:
        self.lines.append(f"-- ==== {file} ====")
        self.parts.append(_Part(file, len(self.lines) + 1))
        self.lines.extend(text.rstrip("\n").split("\n"))

    def code(self, text: str) -> None:
        self.lines.append(text)

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"

    def locate(self, line: int) -> str | None:
        found = None
        for part in self.parts:
            if part.first_line <= line:
                found = part
        if found is None:
            return None
        return f"{found.file}:{line - found.first_line + 1}"


@cache
def _script(name: str) -> _Assembly:
    assembly = _Assembly()
    assembly.add(PRELUDE, prelude())
    for module in module_order(name):
        assembly.add(module_file(module), module_source(module))
    assembly.code("bind(KEYS, ARGV)")
    assembly.add(script_file(name), script_body(name))
    return assembly


def script_source(name: str) -> str:
    """Return the source of script ``name`` as ``EVALSHA`` runs it (``scripting = "eval"``)."""
    return _script(name).text()


@cache
def script_sha(name: str) -> str:
    """Return the SHA1 that EVALSHA uses for script ``name``."""
    return hashlib.sha1(script_source(name).encode("utf-8")).hexdigest()


@cache
def _library() -> tuple[str, str, _Assembly]:
    """Return (library name, function name prefix, assembly) of the Functions library."""
    modules: list[str] = []
    for name in SCRIPT_NAMES:
        modules += [module for module in module_order(name) if module not in modules]
    # The names carry a hash of everything that decides the library's behaviour.
    digest = hashlib.sha1()
    for text in (
        prelude(library=True),
        *(module_source(module) for module in modules),
        *(f"{name}:{name in READ_ONLY}:{script_body(name)}" for name in SCRIPT_NAMES),
    ):
        digest.update(text.encode("utf-8"))
    tag = digest.hexdigest()[:12]
    prefix = f"sbr_{tag}_"
    assembly = _Assembly()
    assembly.code(f"#!lua name=simplebroker_redis_{tag}")
    assembly.add(PRELUDE, prelude(library=True))
    for module in modules:
        assembly.add(module_file(module), module_source(module))
    for name in SCRIPT_NAMES:
        assembly.code(f"redis.register_function{{function_name = '{prefix}{name}',")
        assembly.code("callback = function(keys, args)")
        assembly.code("bind(keys, args)")
        assembly.add(script_file(name), script_body(name))
        flags = "{'no-writes'}" if name in READ_ONLY else "{}"
        assembly.code(f"end, flags = {flags}}}")
    return f"simplebroker_redis_{tag}", prefix, assembly


def library() -> str:
    """Return the Functions library: every module once, one function per operation."""
    return _library()[2].text()


def library_name() -> str:
    """Return the library's name (it carries a hash of the library's text)."""
    return _library()[0]


def function_name(name: ScriptName) -> str:
    """Return the name of operation ``name``'s function in the library."""
    return _library()[1] + name


def locate(ident: str, line: int) -> str | None:
    """Return ``"<file>:<line>"`` for a line of an assembled script or function, or None.

    ``ident`` is what a server error names after ``script:``: the SHA1 of a
    script (EVALSHA), or a function name (FCALL).
    """
    if ident.startswith(_library()[1]):
        return _library()[2].locate(line)
    for name in SCRIPT_NAMES:
        if script_sha(name) == ident:
            return _script(name).locate(line)
    return None
