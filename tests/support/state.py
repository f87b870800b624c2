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
    """Return every key under the namespace prefix, decoded exactly, by short name.

    The keys are read in one MULTI/EXEC, so the snapshot is one moment
    of the namespace even while workers still change it (read key by key,
    a message settled between the reads of ``bodies`` and ``claimed`` looked
    like a body without a member).
    """
    head = Keyspace.for_namespace(namespace).prefix
    keys = sorted(raw.scan_iter(match=head + "*", count=1000))
    typing = raw.pipeline(transaction=False)
    for key in keys:
        typing.type(key)
    kinds = typing.execute()
    reads = raw.pipeline(transaction=True)
    for key, kind in zip(keys, kinds, strict=True):
        if kind == "zset":
            reads.zrange(key, 0, -1, withscores=True)
        elif kind == "hash":
            reads.hgetall(key)
        elif kind == "string":
            reads.get(key)
        elif kind == "list":
            reads.lrange(key, 0, -1)
        elif kind == "set":
            reads.smembers(key)
        else:
            reads.type(key)
    out: dict[str, Any] = {}
    for key, kind, value in zip(keys, kinds, reads.execute(), strict=True):
        out[key[len(head) :]] = sorted(value) if kind == "set" else value
    return out
