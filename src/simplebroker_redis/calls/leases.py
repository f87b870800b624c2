"""Calls of the reservation scripts: reserve, settle (ack, reject), commit, release, renew, recover.

Every reservation operation is built here, once; :mod:`simplebroker_redis.leases`
only runs them (``Leases``: one line per operation, and its asyncio twin).
The Celery result store (:mod:`.celery`) reuses the ordered reservation's
arguments and reply.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence
from typing import Any

from ..keys import Keyspace, format_id
from ..types import (
    Committed,
    Lease,
    LeasedMessage,
    MultiLease,
    Recovery,
    Renewal,
    SettleGroup,
    Settlement,
    SettleMode,
    ValueWrite,
)
from ..validation import optional_id, validate_queue_name
from .base import (
    Call,
    check_limit,
    delay_microseconds,
    flag,
    id_args,
    lease_microseconds,
    new_token,
)


def _check_reservation(
    queue: str, limit: int, target: str, max_deliveries: int | None, dead_letter: str | None
) -> None:
    validate_queue_name(queue)
    check_limit(limit)
    if target:
        validate_queue_name(target)
    if max_deliveries is not None:
        if isinstance(max_deliveries, bool) or not isinstance(max_deliveries, int):
            raise TypeError("max_deliveries must be an integer or None")
        if max_deliveries < 1:
            raise ValueError("max_deliveries must be >= 1")
        if dead_letter is None:
            raise ValueError("max_deliveries requires a dead_letter queue")
    if dead_letter is not None:
        validate_queue_name(dead_letter)
        if dead_letter == queue:
            raise ValueError("dead_letter must differ from the reserved queue")


def reserve(
    queue: str,
    limit: int,
    lease_seconds: float | None,
    *,
    max_deliveries: int | None = None,
    dead_letter: str | None = None,
    target: str = "",
    after: int | None = None,
    before: int | None = None,
    exact: int | None = None,
    order: str = "oldest",
    maintenance: str = "",
    holder: str | None = None,
) -> Call[Lease]:
    """Reserve up to ``limit`` pending messages of ``queue`` for ``lease_seconds``.

    ``reserve.lua``, under a new token; ``None`` never expires.
    ``maintenance`` is a core's piggybacked maintenance request (internal).
    ``holder`` (see :func:`~.base.new_token`): the reserving worker, whose
    own expired reservations the script's recovery step leaves alone.
    """
    _check_reservation(queue, limit, target, max_deliveries, dead_letter)
    token = new_token(holder)
    args = (
        queue,
        token,
        limit,
        lease_microseconds(lease_seconds),
        target,
        optional_id(after),
        optional_id(before),
        optional_id(exact),
        max_deliveries or 0,
        dead_letter or "",
        order,
        maintenance,
    )

    def parse(raw: Any) -> Lease:
        created_us, deadline_us, due_us = int(raw[0]), int(raw[1]), int(raw[2])
        messages = tuple(
            LeasedMessage(int(raw[i]), raw[i + 1], int(raw[i + 2])) for i in range(3, len(raw), 3)
        )
        return Lease(
            token=token,
            queue=queue,
            messages=messages,
            created_ns=created_us * 1000,
            deadline_ns=None if deadline_us < 0 else deadline_us * 1000,
            next_due_seconds=None if due_us < 0 else due_us / 1_000_000,
        )

    return Call(parse, "reserve", args)


def reserve_queues(
    sources: Sequence[tuple[str, str | None]],
    limit: int,
    lease_seconds: float | None,
    *,
    max_deliveries: int | None = None,
    holder: str | None = None,
) -> Call[MultiLease]:
    """Reserve up to ``limit`` pending messages of several queues, in strict order.

    ``reserve_queues.lua``: ``sources`` are (queue, dead-letter queue or
    None) pairs; the first queue's messages come first, then the second's,
    and so on. Each queue that gives messages gets its own token.
    ``holder``: as for :func:`reserve`.
    """
    return Call(
        parse_multi_lease,
        "reserve_queues",
        ordered_args(sources, limit, lease_seconds, max_deliveries, holder),
    )


def ordered_args(
    sources: Sequence[tuple[str, str | None]],
    limit: int,
    lease_seconds: float | None,
    max_deliveries: int | None,
    holder: str | None = None,
) -> tuple[object, ...]:
    """Validate an ordered reservation; return its arguments (a fresh token prefix first).

    ``holder``: the reserving worker (see :func:`~.base.new_token`); its
    tokens are ``<holder>.<random>-<n>``.
    """
    check_limit(limit)
    return (
        new_token(holder),
        limit,
        lease_microseconds(lease_seconds),
        max_deliveries or 0,
        *_source_args(sources, max_deliveries),
    )


#: Sources of ordered reservations already validated, with their arguments. A
#: worker reserves from the same queues (every priority level) again and again.
_VALID_SOURCES: dict[tuple[object, ...], tuple[str, ...]] = {}


def _source_args(
    sources: Sequence[tuple[str, str | None]], max_deliveries: int | None
) -> tuple[str, ...]:
    """Validate an ordered reservation's (queue, dead-letter queue) pairs; return them flat."""
    # The type is part of the key: True == 1, but True is no max_deliveries.
    key = (type(max_deliveries), max_deliveries, *sources)
    try:
        found = _VALID_SOURCES.get(key)
    except TypeError:  # an unhashable source: the checks below refuse it
        found = None
    if found is not None:
        return found
    if not sources:
        raise ValueError("sources cannot be empty")
    for queue, dead_letter in sources:
        _check_reservation(queue, 1, "", max_deliveries, dead_letter)
    if len({queue for queue, _ in sources}) != len(sources):
        raise ValueError("a queue is listed twice")
    args = tuple(arg for queue, dead_letter in sources for arg in (queue, dead_letter or ""))
    if len(_VALID_SOURCES) >= 256:
        _VALID_SOURCES.clear()
    with contextlib.suppress(TypeError):  # unhashable: valid, but not remembered
        _VALID_SOURCES[key] = args
    return args


def parse_multi_lease(raw: Any) -> MultiLease:
    """Parse what ``reserve_queues.lua`` returns (also the tail of ``celery_store.lua``'s)."""
    created_ns, deadline_us, due_us = int(raw[0]) * 1000, int(raw[1]), int(raw[2])
    deadline_ns = None if deadline_us < 0 else deadline_us * 1000
    due = None if due_us < 0 else due_us / 1_000_000
    leases, at = [], 3
    while at < len(raw):
        token, queue, count = str(raw[at]), str(raw[at + 1]), int(raw[at + 2])
        at += 3
        messages = tuple(
            LeasedMessage(int(raw[i]), raw[i + 1], int(raw[i + 2]))
            for i in range(at, at + 3 * count, 3)
        )
        at += 3 * count
        leases.append(Lease(token, queue, messages, created_ns, deadline_ns, due))
    return MultiLease(tuple(leases), created_ns, deadline_ns, due)


def _settlement(raw: Any) -> Settlement:
    return Settlement(int(raw[0]), int(raw[1]))


def settle(
    token: str, mode: SettleMode, target: str = "", ids: Iterable[int] | None = None
) -> Call[Settlement]:
    """``settle.lua``: claim, delete or move (to ``target``) IDs of a token (all when None)."""
    if mode not in ("claim", "delete", "move"):
        raise ValueError("mode must be 'claim', 'delete' or 'move'")
    if target:
        validate_queue_name(target)
    return Call(_settlement, "settle", (token, mode, target, *id_args(ids)))


def ack(token: str, ids: Iterable[int] | None = None, *, delete: bool = False) -> Call[Settlement]:
    """:func:`settle` that consumes ``ids`` of a token (all when None): claimed, or deleted."""
    return settle(token, "delete" if delete else "claim", "", ids)


def reject(token: str, ids: Iterable[int] | None, queue: str) -> Call[Settlement]:
    """:func:`settle` that moves ``ids`` of a token (all when None) to ``queue``, same IDs."""
    validate_queue_name(queue)
    return settle(token, "move", queue, ids)


def _count(raw: Any) -> int:
    return int(raw or 0)


def deliveries(keys: Keyspace, message_id: int) -> Call[int]:
    """How many times ``message_id`` has been reserved (one ``HGET``, no script)."""
    key, field = keys.deliveries, format_id(int(message_id))
    return Call(_count, command=lambda client: client.hget(key, field), idempotent=True)


def _committed(raw: Any) -> Committed:
    settlements = tuple(Settlement(int(raw[i]), int(raw[i + 1])) for i in range(1, len(raw), 2))
    return Committed(int(raw[0]), settlements)


def commit(writes: Sequence[ValueWrite], settlements: Sequence[SettleGroup]) -> Call[Committed]:
    """``commit.lua``: store ``writes`` (those whose fence holds), then settle each group."""
    args: list[object] = [len(writes)]
    for write in writes:
        px = "" if write.px is None else write.px
        if write.fence is None:
            args += (write.value, px, "", "")
        else:
            token, message_id = write.fence
            args += (write.value, px, token, format_id(int(message_id)))
    for group in settlements:
        args += (group.token, group.mode, group.target, len(group.ids), *id_args(group.ids))
    keys = tuple(write.key for write in writes)
    return Call(_committed, "commit", tuple(args), extra_keys=keys)


def release(
    token: str,
    ids: Iterable[int] | None = None,
    *,
    delay_seconds: float = 0.0,
    undeliver: bool = False,
) -> Call[int]:
    """Make ``ids`` of a token (all when None) pending again; return how many.

    ``release.lua``. ``delay_seconds`` keeps them unclaimable that long;
    ``undeliver`` takes back their delivery count (they never reached a
    handler).
    """
    delay = delay_microseconds(delay_seconds)
    return Call(int, "release", (token, delay, flag(undeliver), *id_args(ids)))


def _lost(raw: Any) -> set[str]:
    return {str(token) for token in raw[1:]}


def _renewal(raw: Any) -> Renewal:
    return Renewal(now_ns=int(raw[0]) * 1000, lost=frozenset(str(token) for token in raw[1:]))


def _renew_args(tokens: Iterable[str], lease_seconds: float | None) -> tuple[object, ...]:
    lease = "" if lease_seconds is None else lease_microseconds(lease_seconds)
    return (lease, *tokens)


def renew(tokens: Iterable[str], lease_seconds: float | None = None) -> Call[set[str]]:
    """Extend the leases of ``tokens``; return the tokens that no longer exist.

    ``renew.lua``; ``lease_seconds`` None renews each token for its own lease.
    """
    return Call(_lost, "renew", _renew_args(tokens, lease_seconds))


def renewal(tokens: Iterable[str], lease_seconds: float | None = None) -> Call[Renewal]:
    """:func:`renew`, also returning the server's time (so each new deadline is known)."""
    return Call(_renewal, "renew", _renew_args(tokens, lease_seconds))


def _recovery(raw: Any) -> Recovery:
    return Recovery(released=int(raw[0]), tokens=int(raw[1]), more=bool(int(raw[2])))


def recover(
    queue: str | None = None, *, max_tokens: int = 256, spare: Iterable[str] = ()
) -> Call[Recovery]:
    """Release expired reservations (of ``queue`` or every queue); ``recover.lua``.

    ``spare``: tokens to leave alone however late their renewal (the
    caller's own: a heartbeat names what its process holds).
    """
    if queue is not None:
        validate_queue_name(queue)
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError("max_tokens must be an integer >= 1")
    return Call(_recovery, "recover", (queue or "", max_tokens, *spare))
