"""Every Lua script touches only the keys passed in ``KEYS`` (a static check).

``support/luakeys.py`` follows, through every script exactly as the server
runs it, where each key a ``redis.call`` touches comes from; these tests run
it on every script and on the functions library, and prove on mutants that
it catches keys built from input. ``tests/faults/test_key_names.py`` checks
the same at run time, on the commands a server actually ran.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from simplebroker_redis.scripts import ROOMS, SCRIPT_NAMES, library, script_file, script_source
from support.luakeys import violations

LUA_DIR = Path(__file__).resolve().parents[1] / "src" / "simplebroker_redis" / "lua"


def test_every_lua_file_is_a_registered_script():
    files = {str(path.relative_to(LUA_DIR)) for path in LUA_DIR.rglob("*.lua")}
    operations = {name for name in files if "lib/" not in name}
    assert operations == {script_file(name) for name in SCRIPT_NAMES}


def test_a_frameworks_scripts_live_in_its_room():
    """The core's folder holds the core's scripts; each framework's are in ``lua/<room>/``."""
    assert set(ROOMS) == {"celery", "taskiq", "dramatiq"}
    for name in SCRIPT_NAMES:
        room = next((room for room, (names, _) in ROOMS.items() if name in names), "")
        assert script_file(name) == (f"{room}/{name}.lua" if room else f"{name}.lua")
        assert not name.startswith(("celery_", "dramatiq_", "schedule_")) or room, name


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_script_touches_only_keys_passed_in_keys(name):
    assert violations(script_source(name)) == []


def test_the_functions_library_touches_only_keys_passed_in_keys():
    assert violations(library()) == []


MUTANTS = {
    "concatenated key": "redis.call('HSET', 'sb:' .. ARGV[2], 'x', 1)",
    "argv key": "redis.call('GET', ARGV[2])",
    "local from argv": "local k = ARGV[2]\nredis.call('DEL', k)",
    "helper given argv": "zadd_all(ARGV[2], {})",
    "dynamic command": "redis.call(ARGV[2], K_META)",
    "foreign channel": "redis.call('PUBLISH', 'other:' .. ARGV[2], '1')",
    "foreign sharded channel": "redis.call('SPUBLISH', 'other:' .. ARGV[2], '1')",
    "table with argv": "local ks = {K_META}\nks[#ks + 1] = ARGV[3]\n"
    "for _, key in ipairs(ks) do redis.call('DEL', key) end",
    "rebound constant": "K_META = ARGV[2]",
    "function mixed callers": "local function f(x) return redis.call('GET', x) end\n"
    "f(K_META)\nf(ARGV[2])",
}


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_static_check_catches_keys_built_from_input(mutant):
    assert violations(script_source("claim") + "\n" + MUTANTS[mutant])
