"""Lua modules are declared, not discovered; error codes and constants are defined once.

Each script and each shared module under ``lua/lib`` names the modules it
uses on its ``-- uses:`` line. These tests fail when a file uses a helper of
a module it did not declare (or declares one it does not use), when a
script raises an ``SBR_`` code that ``errors.SCRIPT_ERRORS`` does not
translate, when a script that can raise (itself, or through a function of
its modules) says so on no ``-- Raises`` header line, and when a Lua file
spells out a KEYS index or a constant that the generated prelude defines
from ``keys.py``.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest
from simplebroker.ext import OperationalError

import simplebroker_redis
from simplebroker_redis import scripts
from simplebroker_redis.calls import Call
from simplebroker_redis.errors import SCRIPT_ERRORS, script_error, translate
from simplebroker_redis.keys import FIXED_KEYS, ID_WIDTH, MAGIC, MAX_ID, SCHEMA_VERSION, Keyspace
from support.luakeys import tokenize

LUA = Path(simplebroker_redis.__file__).parent / "lua"
MODULES = sorted(path.stem for path in LUA.rglob("lib/*.lua"))

_DEFINITION = re.compile(r"^local (?:function (\w+)|([\w, ]+?) =)", re.M)
_KEYWORDS = frozenset(
    "and break do else elseif end false for function if in local nil not or repeat "
    "return then true until while".split()
)


def defined_names(text: str) -> set[str]:
    """Return the names a Lua file defines at its top level."""
    names: set[str] = set()
    for function, variables in _DEFINITION.findall(text):
        names.update(n.strip() for n in (function or variables).split(","))
    return names


def used_names(text: str) -> set[str]:
    """Return the identifiers a Lua file uses (not field names after '.' or ':')."""
    tokens = tokenize(text)
    return {
        token
        for i, token in enumerate(tokens)
        if re.fullmatch(r"[A-Za-z_]\w*", token)
        and token not in _KEYWORDS
        and (i == 0 or tokens[i - 1] not in (".", ":"))
    }


PROVIDES = {module: defined_names(scripts.module_source(module)) for module in MODULES}
PRELUDE = defined_names(scripts.prelude())


def undeclared(text: str, own: str = "") -> list[str]:
    """Return 'helper (module)' for every helper ``text`` uses without declaring its module."""
    declared = set(scripts.declared_uses(text))
    used = used_names(text) - defined_names(text)
    return sorted(
        f"{name} ({module})"
        for module, names in PROVIDES.items()
        if module not in declared and module != own
        for name in used & names
    )


def unused_declarations(text: str) -> list[str]:
    used = used_names(text)
    return [module for module in scripts.declared_uses(text) if not used & PROVIDES[module]]


FILES = [(scripts.module_file(m), scripts.module_source(m), m) for m in MODULES] + [
    (scripts.script_file(name), scripts.script_body(name), "") for name in scripts.SCRIPT_NAMES
]


@pytest.mark.parametrize(("file", "text", "own"), FILES, ids=[f for f, _, _ in FILES])
def test_every_file_declares_exactly_the_modules_it_uses(file, text, own):
    assert undeclared(text, own) == []
    assert unused_declarations(text) == []


def test_the_check_finds_an_undeclared_helper():
    mutant = scripts.script_body("claim") + "\nrelease_ids(token, record, {}, 0, false)\n"
    assert undeclared(mutant) == ["release_ids (releasing)"]


def test_every_shared_module_is_used_and_defines_each_name_once():
    used = {module for name in scripts.SCRIPT_NAMES for module in scripts.module_order(name)}
    assert used == set(MODULES)
    everything = [name for names in PROVIDES.values() for name in names] + sorted(PRELUDE)
    assert len(everything) == len(set(everything))


def test_a_script_carries_its_modules_in_dependency_order():
    order = scripts.module_order("reserve")
    assert order.index("guard") < order.index("bulk") < order.index("tokens")
    assert order.index("tokens") < order.index("releasing") < order.index("upkeep")
    assert order.index("upkeep") < order.index("reserving")
    # A script that declares nothing carries the prelude only.
    assert scripts.module_order("cleanup") == ()


#: Most lines of a Lua file: a module holds one idea, an operation one change.
MAX_LUA_LINES = 200


def test_no_lua_file_is_longer_than_one_idea():
    lengths = {
        str(path.relative_to(LUA)): len(path.read_text(encoding="utf-8").splitlines())
        for path in LUA.rglob("*.lua")
    }
    assert {name: n for name, n in lengths.items() if n > MAX_LUA_LINES} == {}


def test_every_raised_error_code_is_in_the_table_and_translated():
    raised = set()
    for path in LUA.rglob("*.lua"):
        raised |= set(re.findall(r"fail\('([A-Z]+)'", path.read_text(encoding="utf-8")))
    assert raised == set(SCRIPT_ERRORS)
    generic = "simplebroker-redis script failed"
    for code in sorted(raised):
        error = script_error(code, "detail", "somewhere")
        assert generic not in str(error), code
        assert SCRIPT_ERRORS[code].meaning
    assert generic in str(script_error("NEWCODE", "detail", "somewhere"))


# -- what each script can raise -----------------------------------------------------
_FUNCTION = re.compile(r"^local function (\w+)\(", re.M)
_LABEL = re.compile(r"^-- [A-Z][A-Za-z ]*(?:\(.*\))?:")


def _functions(text: str) -> dict[str, str]:
    """Return each top-level function of a module with its text (up to the next one)."""
    starts = [(match.start(), match.group(1)) for match in _FUNCTION.finditer(text)]
    ends = [at for at, _ in starts[1:]] + [len(text)]
    return {name: text[at:end] for (at, name), end in zip(starts, ends, strict=True)}


FUNCTIONS = {
    name: body
    for module in MODULES
    for name, body in _functions(scripts.module_source(module)).items()
}


def raised_here(text: str) -> set[str]:
    """Return the codes ``text`` raises itself (``fail('CODE', ...)``)."""
    return set(re.findall(r"fail \( '([A-Z]+)'", " ".join(tokenize(text))))


def raisable(text: str) -> set[str]:
    """Return the codes a script can raise: its own, and those of module functions it reaches."""
    codes, seen = raised_here(text), set()
    pending = set(tokenize(text)) & set(FUNCTIONS)
    while pending:
        name = pending.pop()
        seen.add(name)
        codes |= raised_here(FUNCTIONS[name])
        pending |= (set(tokenize(FUNCTIONS[name])) & set(FUNCTIONS)) - seen
    return codes


def raises_line(text: str) -> set[str] | None:
    """Return the codes the ``-- Raises`` paragraph of a script's header names (None: no line)."""
    header = list(itertools.takewhile(lambda line: line.startswith("--"), text.splitlines()))
    for at, line in enumerate(header):
        if line.startswith("-- Raises"):
            rest = itertools.takewhile(lambda more: not _LABEL.match(more), header[at + 1 :])
            return set(re.findall(r"\b[A-Z]+\b", " ".join([line, *rest]))) & set(SCRIPT_ERRORS)
    return None


SCRIPTS = [(name, scripts.script_body(name)) for name in scripts.SCRIPT_NAMES]


@pytest.mark.parametrize(("name", "text"), SCRIPTS, ids=[name for name, _ in SCRIPTS])
def test_a_script_that_can_raise_says_what_on_its_raises_line(name, text):
    """A script that can raise names its own codes on a ``-- Raises`` line, and none it cannot.

    Codes reached through a shared module (the guard's namespace checks, say)
    may go unnamed: the module's header states them.
    """
    can, named = raisable(text), raises_line(text)
    if not can:
        assert named is None or named == set(), named
        return
    assert named is not None, f"{name}.lua can raise {sorted(can)}: add a '-- Raises' header line"
    assert raised_here(text) - named == set()
    assert named - can == set()


def test_the_raises_check_follows_module_functions():
    assert {"UNINITIALIZED", "FOREIGN", "SCHEMA"} <= raisable("namespace_meta()")
    assert raisable("check_keys({K_QUEUES})") == {"WRONGTYPE"}
    assert raisable("return 1") == set()
    header = "-- x.lua: y\n-- Raises (before any write): ARG, TOKEN.\n-- Returns: 1\n"
    assert raises_line(header) == {"ARG", "TOKEN"}
    assert raises_line("-- x.lua: y\n-- Returns: 1\n") is None


@pytest.mark.parametrize(("file", "text", "own"), FILES, ids=[f for f, _, _ in FILES])
def test_no_lua_file_spells_out_a_key_index_or_a_shared_constant(file, text, own):
    code = " ".join(tokenize(text))
    assert not re.search(r"KEYS \[ \d+ \]", code), "use the K_* names of the prelude"
    assert "ARGV [ 1 ]" not in code, "ARGV[1] is the prelude's WAKE_PREFIX"
    for literal in (f"'{MAGIC}'", f"'{0:0{ID_WIDTH}d}'", f"'{MAX_ID}'", str(ID_WIDTH)):
        assert literal not in code.split(), literal


def test_the_prelude_matches_keys_py_on_the_server(raw, runner):
    keys = list(runner.keys.fixed_keys)
    names = ", ".join(f"K_{name.upper()}" for name, _ in FIXED_KEYS)
    prelude = f"{scripts.prelude()}\nbind(KEYS, ARGV)\n"
    got = raw.eval(f"{prelude}return {{{names}}}", len(keys), *keys, "wake")
    assert got == keys == list(Keyspace.for_namespace(runner.keys.namespace).fixed_keys)
    types = raw.eval(
        f"{prelude}local out = {{}}\n"
        "for i = 1, #KEYS do out[i] = key_type(KEYS[i]) end\nreturn out",
        len(keys),
        *keys,
        "wake",
    )
    assert types == [kind for _, kind in FIXED_KEYS]
    constants = raw.eval(
        f"{prelude}return "
        "{MAGIC, SCHEMA, tostring(ID_WIDTH), ZERO_ID, MAX_ID, WAKE_PREFIX, FIXED_KEYS}",
        len(keys),
        *keys,
        "wake",
    )
    assert constants == [
        MAGIC,
        str(SCHEMA_VERSION),
        str(ID_WIDTH),
        "0" * ID_WIDTH,
        str(MAX_ID),
        "wake",
        len(FIXED_KEYS),
    ]


def test_a_server_error_names_the_lua_file_and_line(runner):
    runner.ensure_initialized()
    body = scripts.script_body("write").splitlines()
    line = next(i for i, text in enumerate(body, 1) if text.startswith("if keep > 0"))
    # keep_newest 'x' makes tonumber() nil: a Lua runtime error at that line.
    bad = Call(int, "write", ("q", "body", f"{10**18:019d}", "x", "0", ""))
    with pytest.raises(OperationalError) as caught:
        runner.run(bad)
    assert f"write.lua:{line}:" in str(caught.value)
    assert "user_function" not in str(caught.value)


def test_locate_maps_every_part_of_an_assembled_script():
    sha = scripts.script_sha("reserve")
    lines = scripts.script_source("reserve").splitlines()
    for number, text in enumerate(lines, 1):
        if text.startswith("-- ==== "):
            file = text.removeprefix("-- ==== ").removesuffix(" ====")
            assert scripts.locate(sha, number + 1) == f"{file}:1"
    assert scripts.locate("0" * 40, 3) is None


def test_translate_rewrites_only_known_scripts():
    import redis.exceptions as rx

    sha = scripts.script_sha("peek")
    error = translate(
        rx.ResponseError(f"user_script:9: boom script: {sha}, on @user_script:9."), "w"
    )
    assert "user_script" not in str(error)
    assert f"{scripts.locate(sha, 9)}: boom" in str(error)
    unknown = translate(
        rx.ResponseError("user_script:9: boom script: " + "f" * 40 + ", on @x."), "w"
    )
    assert "user_script:9" in str(unknown)
