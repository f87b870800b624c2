"""No Lua script can reach a key outside the namespace's hash tag, at run time.

MONITOR while every operation runs with hostile-looking queue names and
task IDs, then ``COMMAND GETKEYS`` on every command the server ran. The
static check of the scripts themselves is ``tests/test_lua_keys.py``.
"""

from __future__ import annotations

import codecs
import re
import threading

import pytest
import redis

from simplebroker_redis.keys import Keyspace
from simplebroker_redis.scripts import SCRIPT_NAMES, function_name

from .exercise import Names, exercise, exercise_celery, exercise_dramatiq

_MONITOR_LINE = re.compile(r"^[\d.]+ \[\d+ ([^\]]*)\] (.*)$", re.S)


def _monitor(url: str, lines: list[tuple[str, list[str]]], ready: threading.Event) -> None:
    """Collect (client, words) of every command the server runs until ECHO monitor-stop."""
    client = redis.Redis.from_url(url)
    connection = client.connection_pool.get_connection()
    connection.send_command("MONITOR")
    assert connection.read_response() == b"OK"
    ready.set()
    try:
        while True:
            match = _MONITOR_LINE.match(connection.read_response().decode())
            assert match, "unexpected MONITOR line"
            words = _split_monitor(match.group(2))
            if words[:2] == ["ECHO", "monitor-stop"]:
                return
            lines.append(("lua" if match.group(1) == "lua" else "client", words))
    finally:
        connection.disconnect()
        client.close()


def _split_monitor(command: str) -> list[str]:
    """Split MONITOR's command text: double-quoted words, C-style escapes."""
    return [
        codecs.escape_decode(word.encode())[0].decode("utf-8", "replace")  # type: ignore[no-untyped-call]
        for word in re.findall(r'"((?:\\.|[^"\\])*)"', command)
    ]


HOSTILE = Names(
    main="meta",
    other="0000000000000000001",
    target="queues",
    dead="_",
    alias="sb",
    task_id="}{other}:*?[x]",
)


@pytest.mark.parametrize("names", [Names(), HOSTILE], ids=["plain", "hostile"])
def test_every_key_touched_stays_inside_the_namespace(make_server, names):
    server = make_server("monitor")
    namespace = "watched"
    lines: list[tuple[str, list[str]]] = []
    ready = threading.Event()
    thread = threading.Thread(target=_monitor, args=(server.url, lines, ready), daemon=True)
    thread.start()
    assert ready.wait(10)
    exercise(server.url, namespace, names)
    exercise_celery(server.url, namespace, names)
    exercise_dramatiq(server.url, namespace, names)
    admin = redis.Redis.from_url(server.url, decode_responses=True)
    admin.echo("monitor-stop")
    thread.join(20)
    assert not thread.is_alive()

    keys = Keyspace.for_namespace(namespace)
    fixed = set(keys.fixed_keys)
    problems, scripts_run = [], set()
    passed: set[str] = set()  # the KEYS of the script running now
    for client, words in lines:
        name = words[0].upper()
        if name in ("EVALSHA", "FCALL"):
            scripts_run.add(words[1])
            passed = set(words[3 : 3 + int(words[2])])
        # SPUBLISH/SSUBSCRIBE declare their channel as a key (cluster routing):
        # channels are checked below, as channels.
        sharded = name in ("SPUBLISH", "SSUBSCRIBE", "SUNSUBSCRIBE")
        for key in [] if sharded else _keys_of(admin, words):
            if not key.startswith(keys.prefix):
                problems.append((client, words[:4]))
            elif client == "lua" and key not in fixed and key not in passed:
                # Only keys the caller passed in KEYS (commit's result keys).
                problems.append(("lua, not a key passed in KEYS", words[:4]))
        if name in ("PUBLISH", "SUBSCRIBE", "UNSUBSCRIBE") or sharded:
            for channel in words[1:2] if name.endswith("PUBLISH") else words[1:]:
                if not channel.startswith(keys.wake_prefix):
                    problems.append(("channel", words[:3]))
    assert not problems, problems[:10]
    assert sum(client == "lua" for client, _ in lines) > 100, "MONITOR showed no script commands"
    every_function = {function_name(n) for n in SCRIPT_NAMES}
    assert scripts_run >= every_function, "some functions were not exercised"
    admin.close()


def _keys_of(admin: redis.Redis, words: list[str]) -> list[str]:
    try:
        return [str(key) for key in admin.command_getkeys(*words)]
    except redis.ResponseError:
        return []  # a command without key arguments
