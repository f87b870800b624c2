"""What a namespace stores, read straight from the server (never through the backend).

:func:`stored` decodes the fixed keys the way the storage tests compare them;
:func:`snapshot` takes every key under the namespace prefix exactly, scores
included, for tests that must state all that a fault left behind.
"""

from __future__ import annotations

from typing import Any

import redis

from simplebroker_redis.keys import Keyspace, member

#: Short names of the fixed keys whose content :func:`stored` decodes.
SHORT_NAMES = tuple(key.rsplit(":", 1)[1] for key in Keyspace.for_namespace("x").fixed_keys)


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


def snapshot(raw: redis.Redis, namespace: str) -> dict[str, Any]:
    """Return every key under the namespace prefix, decoded exactly, by short name."""
    head = Keyspace.for_namespace(namespace).prefix
    out: dict[str, Any] = {}
    for key in sorted(raw.scan_iter(match=head + "*", count=1000)):
        short = key[len(head) :]
        kind = raw.type(key)
        if kind == "zset":
            out[short] = raw.zrange(key, 0, -1, withscores=True)
        elif kind == "hash":
            out[short] = raw.hgetall(key)
        elif kind == "string":
            out[short] = raw.get(key)
        elif kind == "list":
            out[short] = raw.lrange(key, 0, -1)
        elif kind == "set":
            out[short] = sorted(raw.smembers(key))
        else:
            out[short] = kind
    return out
