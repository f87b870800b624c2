"""The integration's Lua scripts: one file per atomic operation, run by EVALSHA.

Each script opens with a header listing its KEYS, ARGV and reply. redis-py's
``Script`` sends EVALSHA and loads the script on NOSCRIPT (after a server
restart), so a script costs one round trip.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from importlib.resources import files
from typing import Any, Literal

from simplebroker_redis import RedisRunner

ScriptName = Literal["bind", "exchange_table", "chord_part"]

_SOURCES: dict[str, str] = {}
_LOCK = threading.Lock()


def _source(name: str) -> str:
    with _LOCK:
        text = _SOURCES.get(name)
        if text is None:
            text = _SOURCES[name] = (files(__package__) / "lua" / f"{name}.lua").read_text("utf-8")
        return text


def run_script(
    runner: RedisRunner,
    name: ScriptName,
    keys: Sequence[str],
    args: Sequence[object],
    *,
    idempotent: bool = False,
) -> Any:
    """Run the script ``name`` through the runner (errors translated there)."""
    text = _source(name)

    def call(client: Any) -> Any:
        return client.register_script(text)(keys=list(keys), args=list(args), client=client)

    return runner.execute(call, idempotent=idempotent)
