"""Calls of SimpleBroker's queue operations: the namespace, writes, reads, probes, deletes.

These are the scripts behind :class:`~simplebroker_redis.RedisBrokerCore`
(and the asyncio writer): a namespace's creation and its ID high-water,
writing messages, claiming, moving and reading them, the cheap questions
about one queue, and deleting, renaming, aliasing and vacuuming.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any, Final, Literal

from simplebroker.metadata import QueueStats

from ..keys import FIXED_KEYS, Keyspace, format_id, queue_bounds
from ..types import Broadcast, Dedupe, Row, TakeMode
from ..validation import finite_number, optional_id, validate_queue_name
from .base import Call, flag, id_args, parse_bool


def _ids(raw: Any) -> list[int]:
    return [int(value) for value in raw]


def _rows(raw: Any) -> list[Row]:
    return [(raw[i + 1], int(raw[i])) for i in range(0, len(raw), 2)]


def _pair(raw: Any) -> tuple[int, int]:
    return int(raw[0]), int(raw[1])


# -- namespace and identity ---------------------------------------------------------
def init(mode: Literal["init", "check"]) -> Call[str]:
    """``init.lua``: create (``init``) or only validate (``check``) the namespace."""
    return Call(str, "init", (mode,), idempotent=mode == "check")


def cleanup() -> Call[int]:
    """``cleanup.lua``: delete every fixed key; return how many existed."""
    return Call(int, "cleanup")


def advance_ts(new_ts: int) -> Call[bool]:
    """``advance_ts.lua``: raise the durable high-water to ``new_ts``; True if it moved."""
    return Call(parse_bool, "advance_ts", (format_id(new_ts),))


def stamp(candidate: int) -> Call[int]:
    """``stamp.lua``: allocate one ID (no message) and record it as the high-water."""
    return Call(int, "stamp", (format_id(candidate),))


def resync() -> Call[tuple[int, int]]:
    """``resync.lua``: raise a high-water below a stored ID; (old, new)."""
    return Call(_pair, "resync")


def _key_types(client: Any, keys: Keyspace) -> Any:
    pipe = client.pipeline(transaction=False)
    for key in keys.fixed_keys:
        pipe.type(key)
    return pipe.execute()  # a list, or an awaitable of one on an asyncio client


def key_types(keys: Keyspace) -> Call[dict[str, tuple[str, str]]]:
    """TYPE of every fixed key: ``{key: (type found, type expected)}`` (one round trip)."""

    def parse(raw: Any) -> dict[str, tuple[str, str]]:
        return {
            key: (str(kind), expected)
            for key, kind, (_, expected) in zip(keys.fixed_keys, raw, FIXED_KEYS, strict=True)
        }

    return Call(parse, command=lambda client: _key_types(client, keys), idempotent=True)


# -- writes -------------------------------------------------------------------------
#: Seconds a write's idempotency key is kept by default: a write sent again
#: with the same key within this window (after its reply was lost, say)
#: stores nothing. Like the duplicate-detection windows of SQS FIFO queues
#: (5 minutes) and Azure Service Bus (10 minutes by default).
DEFAULT_DEDUPE_SECONDS: Final[float] = 600.0

#: What an idempotency key may be: printable ASCII without spaces, 1-200
#: characters (task and message IDs: UUIDs, hex, ...).
_DEDUPE_KEY_RE: Final = re.compile(r"^[!-~]{1,200}$")


def dedupe(keys: Keyspace, key: str, seconds: float = DEFAULT_DEDUPE_SECONDS) -> Dedupe:
    """Return the idempotency key ``key`` of a write in ``keys``' namespace, kept ``seconds``.

    Raises ValueError for a key that is not 1-200 printable ASCII
    characters without spaces, or a window under 1 ms.
    """
    if not isinstance(key, str) or not _DEDUPE_KEY_RE.match(key):
        raise ValueError(
            f"an idempotency key is 1-200 printable ASCII characters without spaces, not {key!r}"
        )
    window_ms = round(finite_number(seconds, "dedupe_seconds", bound=0) * 1000)
    if window_ms < 1:
        raise ValueError("dedupe_seconds must be at least 0.001")
    return Dedupe(keys.sent_key(key), window_ms)


def write(
    queue: str,
    body: str,
    candidate: int,
    *,
    keep_newest: int = 0,
    delay_us: int = 0,
    maintenance: str = "",
    task_key: str = "",
    once: Dedupe | None = None,
) -> Call[int]:
    """``write.lua``: one message (optionally delayed, or trimming the queue); its ID.

    ``task_key`` indexes the message under a framework's task id
    (:func:`~simplebroker_redis.tasks.index_key`; '' for none). ``once``:
    the write's idempotency key (see :func:`dedupe`).
    """
    args: tuple[object, ...] = (
        queue,
        body,
        format_id(candidate),
        keep_newest,
        delay_us,
        maintenance,
        task_key,
    )
    if once is None:
        return Call(int, "write", args)
    return Call(int, "write", (*args, once.window_ms), extra_keys=(once.key,))


#: One message of a group commit: (queue, body, delay in us[, task index
#: key[, idempotency key]]).
BatchItem = (
    tuple[str, str, int] | tuple[str, str, int, str] | tuple[str, str, int, str, Dedupe | None]
)


def write_batch(candidate: int, items: Sequence[BatchItem]) -> Call[list[int]]:
    """``write_batch.lua``: several messages, all or nothing.

    Each item is (queue, body, delay in us), optionally with a task index
    key fourth ('' for none) and an idempotency key fifth (see
    :func:`dedupe`; None for none).
    """
    args: list[object] = [format_id(candidate)]
    keys: list[str] = []
    for item in items:
        task_key = item[3] if len(item) > 3 else ""
        once = item[4] if len(item) > 4 else None
        args += (*item[:3], task_key, "" if once is None else once.window_ms)
        if once is not None:
            keys.append(once.key)
    return Call(_ids, "write_batch", tuple(args), extra_keys=tuple(keys))


def insert(
    required_last_ts: int, records: Iterable[tuple[str, str, int] | tuple[str, str, int, str]]
) -> Call[int]:
    """``insert.lua``: (queue, body, exact id[, task key]) messages, all or nothing."""
    args: list[object] = [format_id(required_last_ts)]
    for record in records:
        queue, body, message_id = record[:3]
        args += (queue, format_id(message_id), body, record[3] if len(record) > 3 else "")
    return Call(int, "insert", tuple(args))


def _broadcast(raw: Any) -> Broadcast:
    if int(raw[0]) == 0:
        return Broadcast(0, 0, 0)
    return Broadcast(int(raw[0]), int(raw[1]), int(raw[2]))


def broadcast(
    body: str,
    mode: Literal["all", "existing", "create"],
    candidates: Sequence[int],
    names: Sequence[str] = (),
) -> Call[Broadcast]:
    """``broadcast.lua``: one copy of ``body`` in each selected queue."""
    args = (body, mode, len(candidates), *(format_id(c) for c in candidates), *names)
    return Call(_broadcast, "broadcast", args)


# -- reads, claims and moves -----------------------------------------------------------
def claim(
    queue: str,
    op: TakeMode,
    *,
    target: str = "",
    limit: int = 1,
    order: str = "oldest",
    after: int | None = None,
    before: int | None = None,
    exact: int | None = None,
    with_claimed: bool = False,
    maintenance: str = "",
) -> Call[list[Row]]:
    """``claim.lua``: claim (or move to ``target``) up to ``limit`` messages."""
    args = (
        queue,
        op,
        target,
        limit,
        order,
        optional_id(after),
        optional_id(before),
        optional_id(exact),
        flag(with_claimed),
        maintenance,
    )
    return Call(_rows, "claim", args)


def peek(
    queue: str,
    *,
    limit: int,
    order: str = "oldest",
    after: int | None = None,
    before: int | None = None,
    exact: int | None = None,
    include_claimed: bool = False,
) -> Call[list[Row]]:
    """``peek.lua``: up to ``limit`` messages, unchanged."""
    args = (
        queue,
        limit,
        order,
        optional_id(after),
        optional_id(before),
        optional_id(exact),
        flag(include_claimed),
    )
    return Call(_rows, "peek", args, idempotent=True)


def _stats(raw: Any) -> list[QueueStats]:
    out = []
    for i in range(0, len(raw), 3):
        pending, claimed = int(raw[i + 1]), int(raw[i + 2])
        out.append(QueueStats(raw[i], pending, claimed, pending + claimed))
    return out


def stats(
    queue: str | None = None, lex_range: tuple[str, str] | None = None
) -> Call[list[QueueStats]]:
    """``stats.lua``: counts of one queue, of a registry lex range, or of every queue."""
    if queue is not None:
        args: tuple[object, ...] = ("one", queue)
    elif lex_range is not None:
        args = ("range", *lex_range)
    else:
        args = ("all",)
    return Call(_stats, "stats", args, idempotent=True)


def _zlexcounts(client: Any, key: str, bounds: list[tuple[str, str]]) -> Any:
    pipe = client.pipeline(transaction=False)
    for low, high in bounds:
        pipe.zlexcount(key, low, high)
    return pipe.execute()  # a list, or an awaitable of one on an asyncio client


def ready_count(keys: Keyspace, queues: Sequence[str]) -> Call[int]:
    """Messages of ``queues`` together a reservation could take now (neither reserved nor delayed).

    AMQP's "ready" count (kombu's ``queue_declare``) of a Celery queue, which
    is one storage queue per priority level; SimpleBroker's stats count
    reserved and delayed messages as pending too. One ``ZLEXCOUNT`` per
    queue, all on the pending set, in one round trip.
    """
    bounds = [queue_bounds(validate_queue_name(queue)) for queue in queues]
    return Call(
        lambda raw: sum(int(count) for count in raw),
        command=lambda client: _zlexcounts(client, keys.pending, bounds),
        idempotent=True,
    )


def _found(raw: Any) -> tuple[int | None, list[int]]:
    return (int(raw[0]) if raw[0] else None), [int(value) for value in raw[1:]]


def find(
    queue: str,
    needle: str,
    *,
    wanted: int,
    after: int | None,
    before: int | None,
    include_claimed: bool,
    chunk: int,
) -> Call[tuple[int | None, list[int]]]:
    """``find.lua``: one chunk of a body search; (resume cursor or None, IDs found)."""
    args = (
        queue,
        needle,
        wanted,
        optional_id(after),
        optional_id(before),
        flag(include_claimed),
        chunk,
    )
    return Call(_found, "find", args, idempotent=True)


# -- probes: cheap read-only questions about one queue ----------------------------------
def probe_exists(queue: str) -> Call[bool]:
    """``probe_exists.lua``: whether ``queue`` holds any message, claimed included."""
    return Call(parse_bool, "probe_exists", (queue,), idempotent=True)


def probe_pending(queue: str, after: int | None = None) -> Call[bool]:
    """``probe_pending.lua``: whether ``queue`` has a pending message (above ``after``)."""
    return Call(parse_bool, "probe_pending", (queue, optional_id(after)), idempotent=True)


def _optional_id(raw: Any) -> int | None:
    return int(raw) if raw else None


def probe_latest(queue: str) -> Call[int | None]:
    """``probe_latest.lua``: the newest pending message ID of ``queue``, or None."""
    return Call(_optional_id, "probe_latest", (queue,), idempotent=True)


# -- deletes, renames, aliases, vacuum ---------------------------------------------------
def delete_queues(names: Sequence[str], before: int | None = None) -> Call[int]:
    """``delete_queues.lua``: every message of ``names`` (below ``before``); the count."""
    return Call(int, "delete_queues", (optional_id(before), *names))


def delete_ids(queue: str, ids: Iterable[int]) -> Call[int]:
    """``delete_ids.lua``: exact IDs of one queue; the count."""
    return Call(int, "delete_ids", (queue, *id_args(ids)))


def rename(old: str, new: str, *, retarget_aliases: bool, version: int) -> Call[tuple[int, int]]:
    """``rename.lua``: (messages renamed, aliases retargeted)."""
    return Call(_pair, "rename", (old, new, flag(retarget_aliases), version))


def alias_add(alias: str, target: str, version: int) -> Call[int]:
    """``alias_add.lua``: add an alias, validated against the live map."""
    return Call(int, "alias_add", (alias, target, version))


def alias_remove(alias: str, version: int) -> Call[bool]:
    """``alias_remove.lua``: remove an alias; True when it existed."""
    return Call(parse_bool, "alias_remove", (alias, version))


def vacuum(batch: int) -> Call[tuple[int, int]]:
    """``vacuum.lua``: remove up to ``batch`` claimed messages; (removed, left)."""
    return Call(_pair, "vacuum", (batch,))
