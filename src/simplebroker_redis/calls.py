"""One typed call per Lua script: what it sends, and how its reply is read.

Each function here validates its arguments and returns a :class:`Call`: the
script to run, its ``ARGV`` (after the wake prefix every script receives
first), any extra ``KEYS`` after the fixed ones, and the parser of its
reply. Both runners execute a call the same way
(``RedisRunner.run(call)``, ``await AsyncRedisRunner.run(call)``), so the
sync core, the reservation API and the asyncio integrations never build an
argument list or read a reply of their own. Each script's header
(``lua/<name>.lua``) documents the same arguments and reply.
"""

from __future__ import annotations

import contextlib
import re
import uuid
from collections.abc import Callable, Generator, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

from simplebroker.metadata import QueueStats

from .keys import FIXED_KEYS, Keyspace, format_id, queue_bounds
from .scripts import ScriptName
from .validation import finite_number, optional_id, validate_queue_name

R = TypeVar("R")

Row = tuple[str, int]  #: (body, id), SimpleBroker's row shape
SettleMode = Literal["claim", "delete", "move"]
TakeMode = Literal["claim", "move"]
Order = Literal["oldest", "newest"]


@dataclass(frozen=True, slots=True)
class Call(Generic[R]):
    """One script run: name, arguments, and the parser of its reply.

    ``command`` instead of ``script`` runs plain commands (a function of
    the client, sync or asyncio alike; one command when ``writes``).
    ``idempotent`` calls change nothing and may be retried once after a
    connection error. ``writes`` marks a plain command that changes data:
    with the durability options it is followed by WAIT/WAITAOF, as every
    state-changing script is. A call bound to an
    asyncio runner (``dataclasses.replace(call, runner=...)``) can be awaited
    directly.
    """

    parse: Callable[[Any], R]
    script: ScriptName | None = None
    args: tuple[object, ...] = ()
    extra_keys: tuple[str, ...] = ()
    command: Callable[[Any], Any] | None = None
    idempotent: bool = False
    runner: Any = None  #: an asyncio runner this call is bound to (``AsyncLeases``)
    writes: bool = False  #: a plain command that changes data (see above)

    def __await__(self) -> Generator[Any, None, R]:
        """Run this call on the asyncio runner it is bound to, and return its reply."""
        if self.runner is None:
            raise TypeError("this call is not bound to an asyncio runner: use runner.run(call)")
        reply: Generator[Any, None, R] = self.runner.run(self).__await__()
        return reply


# -- reply types ----------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class LeasedMessage:
    """One reserved message."""

    id: int
    body: str
    deliveries: int  #: times this message has been reserved, this one included


@dataclass(frozen=True, slots=True)
class Lease:
    """The result of a reservation; ``messages`` is empty when none was pending."""

    token: str
    queue: str
    messages: tuple[LeasedMessage, ...]
    created_ns: int  #: server time of the reservation, integer nanoseconds
    deadline_ns: int | None  #: lease expiry (server time), None: never expires
    next_due_seconds: float | None  #: when a delayed message becomes due, if any

    @property
    def ids(self) -> tuple[int, ...]:
        """Return the reserved message IDs in delivery order."""
        return tuple(message.id for message in self.messages)


@dataclass(frozen=True, slots=True)
class Settlement:
    """Outcome of ack/reject: IDs settled, and IDs the token no longer held."""

    settled: int
    lost: int


@dataclass(frozen=True, slots=True)
class Recovery:
    """Outcome of a recovery pass."""

    released: int  #: live message IDs made pending again (or dead-lettered)
    tokens: int  #: expired reservations recovered
    more: bool  #: True when more expired reservations may remain


@dataclass(frozen=True, slots=True)
class Broadcast:
    """Outcome of a broadcast: copies written and the first and last IDs."""

    count: int
    first: int
    last: int


@dataclass(frozen=True, slots=True)
class ValueWrite:
    """A value to ``SET`` in the ``commit`` script (a task result), expiry in ms."""

    key: str
    value: str
    px: int | None


@dataclass(frozen=True, slots=True)
class DeadLetterEntry:
    """One entry of the dead-letter journal: a message dead-lettered after max deliveries."""

    entry: str  #: journal entry ID (give it to ``dead_letter_ack``)
    queue: str  #: the queue it was reserved from
    dead_letter_queue: str  #: where it went
    id: int  #: message ID (the same in the dead-letter queue)
    deliveries: int  #: deliveries it had used up
    body: str | None  #: its body; None when the message is gone already


@dataclass(frozen=True, slots=True)
class DeadLetterPage:
    """Entries of the dead-letter journal after a cursor."""

    entries: tuple[DeadLetterEntry, ...]  #: those of the queues asked for
    cursor: str  #: read on after this entry ID (the last one scanned)
    more: bool  #: True when more entries may follow the cursor


@dataclass(frozen=True, slots=True)
class DeadLetterAck:
    """Outcome of ``dead_letter_ack``."""

    acked: bool  #: this call took the entry out of the journal (report it)
    stored: bool  #: this call stored the value (no value was there)


@dataclass(frozen=True, slots=True)
class LostRun:
    """A claimed schedule run whose claim expired unsent (its scheduler died)."""

    schedule_id: str
    run: str  #: the run's name (give it to ``schedule_claim(..., "retry", run)``)
    schedule: str  #: the schedule's JSON when it was claimed
    claimed_us: int  #: when it was first claimed (server time, microseconds)


@dataclass(frozen=True, slots=True)
class ScheduleTable:
    """The stored schedules, and the claimed runs that were lost."""

    schedules: dict[str, str]  #: schedule id -> JSON
    lost: tuple[LostRun, ...]


@dataclass(frozen=True, slots=True)
class SettleGroup:
    """One settlement of the ``commit`` script: IDs of a token, and what to do."""

    token: str
    mode: SettleMode
    target: str
    ids: tuple[int, ...]


# -- argument helpers -------------------------------------------------------------
def new_token() -> str:
    """Return a fresh reservation token."""
    return uuid.uuid4().hex


def lease_microseconds(lease_seconds: float | None) -> int:
    """Return a lease as integer microseconds (-1: never expires).

    The lease is first made exact integer nanoseconds; a reservation is stale
    once ``now_ns - created_ns > lease_ns`` on the server clock, which for
    microsecond server clocks is ``now_us > created_us + lease_ns // 1000``.
    """
    if lease_seconds is None:
        return -1
    seconds = finite_number(lease_seconds, "lease_seconds", bound=0)
    return round(seconds * 1_000_000_000) // 1000


def delay_microseconds(delay_seconds: float) -> int:
    """Return a delay as integer microseconds; raise for a non-finite or negative one."""
    return round(finite_number(delay_seconds, "delay_seconds", bound=0) * 1_000_000)


def id_args(ids: Iterable[int] | None) -> list[str]:
    """Return script ARGV for an ID selection (``'*'`` for all of a token)."""
    if ids is None:
        return ["*"]
    return [format_id(int(message_id)) for message_id in ids]


def _flag(value: bool) -> str:
    return "1" if value else "0"


def _int(raw: Any) -> int:
    return int(raw)


def _bool(raw: Any) -> bool:
    return bool(int(raw))


def _ids(raw: Any) -> list[int]:
    return [int(value) for value in raw]


def _rows(raw: Any) -> list[Row]:
    return [(raw[i + 1], int(raw[i])) for i in range(0, len(raw), 2)]


def _pair(raw: Any) -> tuple[int, int]:
    return int(raw[0]), int(raw[1])


def _settlement(raw: Any) -> Settlement:
    return Settlement(int(raw[0]), int(raw[1]))


# -- namespace and identity ---------------------------------------------------------
def init(mode: Literal["init", "check"]) -> Call[str]:
    """``init.lua``: create (``init``) or only validate (``check``) the namespace."""
    return Call(str, "init", (mode,), idempotent=mode == "check")


def cleanup() -> Call[int]:
    """``cleanup.lua``: delete every fixed key; return how many existed."""
    return Call(_int, "cleanup")


def advance_ts(new_ts: int) -> Call[bool]:
    """``advance_ts.lua``: raise the durable high-water to ``new_ts``; True if it moved."""
    return Call(_bool, "advance_ts", (format_id(new_ts),))


def stamp(candidate: int) -> Call[int]:
    """``stamp.lua``: allocate one ID (no message) and record it as the high-water."""
    return Call(_int, "stamp", (format_id(candidate),))


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
def write(
    queue: str,
    body: str,
    candidate: int,
    *,
    keep_newest: int = 0,
    delay_us: int = 0,
    maintenance: str = "",
) -> Call[int]:
    """``write.lua``: one message (optionally delayed, or trimming the queue); its ID."""
    args = (queue, body, format_id(candidate), keep_newest, delay_us, maintenance)
    return Call(_int, "write", args)


def write_batch(candidate: int, items: Sequence[tuple[str, str, int]]) -> Call[list[int]]:
    """``write_batch.lua``: several (queue, body, delay in us) messages, all or nothing."""
    args: list[object] = [format_id(candidate)]
    for queue, body, delay_us in items:
        args += (queue, body, delay_us)
    return Call(_ids, "write_batch", tuple(args))


def insert(required_last_ts: int, records: Iterable[tuple[str, str, int]]) -> Call[int]:
    """``insert.lua``: (queue, body, exact id) messages, all or nothing."""
    args: list[object] = [format_id(required_last_ts)]
    for queue, body, message_id in records:
        args += (queue, format_id(message_id), body)
    return Call(_int, "insert", tuple(args))


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
        _flag(with_claimed),
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
        _flag(include_claimed),
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


def probe_exists(queue: str) -> Call[bool]:
    """``probe.lua``: whether ``queue`` holds any message, claimed included."""
    return Call(_bool, "probe", ("exists", queue, ""), idempotent=True)


def probe_pending(queue: str, after: int | None = None) -> Call[bool]:
    """``probe.lua``: whether ``queue`` has a pending message (above ``after``)."""
    return Call(_bool, "probe", ("pending", queue, optional_id(after)), idempotent=True)


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


def _optional_id(raw: Any) -> int | None:
    return int(raw) if raw else None


def probe_latest(queue: str) -> Call[int | None]:
    """``probe.lua``: the newest pending message ID of ``queue``, or None."""
    return Call(_optional_id, "probe", ("latest", queue, ""), idempotent=True)


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
        _flag(include_claimed),
        chunk,
    )
    return Call(_found, "find", args, idempotent=True)


# -- deletes, renames, aliases, vacuum ---------------------------------------------------
def delete_queues(names: Sequence[str], before: int | None = None) -> Call[int]:
    """``delete_queues.lua``: every message of ``names`` (below ``before``); the count."""
    return Call(_int, "delete_queues", (optional_id(before), *names))


def delete_ids(queue: str, ids: Iterable[int]) -> Call[int]:
    """``delete_ids.lua``: exact IDs of one queue; the count."""
    return Call(_int, "delete_ids", (queue, *id_args(ids)))


def rename(old: str, new: str, *, retarget_aliases: bool, version: int) -> Call[tuple[int, int]]:
    """``rename.lua``: (messages renamed, aliases retargeted)."""
    return Call(_pair, "rename", (old, new, _flag(retarget_aliases), version))


def alias_add(alias: str, target: str, version: int) -> Call[int]:
    """``alias_add.lua``: add an alias, validated against the live map."""
    return Call(_int, "alias_add", (alias, target, version))


def alias_remove(alias: str, version: int) -> Call[bool]:
    """``alias_remove.lua``: remove an alias; True when it existed."""
    return Call(_bool, "alias_remove", (alias, version))


def vacuum(batch: int) -> Call[tuple[int, int]]:
    """``vacuum.lua``: remove up to ``batch`` claimed messages; (removed, left)."""
    return Call(_pair, "vacuum", (batch,))


# -- reservations ----------------------------------------------------------------------
def _check_limit(limit: int) -> None:
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError("limit must be an integer >= 1")


def _check_reservation(
    queue: str, limit: int, target: str, max_deliveries: int | None, dead_letter: str | None
) -> None:
    validate_queue_name(queue)
    _check_limit(limit)
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
) -> Call[Lease]:
    """Reserve up to ``limit`` pending messages of ``queue`` for ``lease_seconds``.

    ``reserve.lua``, under a new token; ``None`` never expires.
    ``maintenance`` is a core's piggybacked maintenance request (internal).
    """
    _check_reservation(queue, limit, target, max_deliveries, dead_letter)
    token = new_token()
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


@dataclass(frozen=True, slots=True)
class MultiLease:
    """The result of a reservation from several queues: one lease per queue that gave messages."""

    leases: tuple[Lease, ...]  #: in the order of the queues asked for
    created_ns: int  #: server time of the reservation, integer nanoseconds
    deadline_ns: int | None  #: lease expiry (server time), None: never expires
    next_due_seconds: float | None  #: when a delayed message becomes due, if any

    @property
    def messages(self) -> tuple[LeasedMessage, ...]:
        """Return every reserved message, queue by queue."""
        return tuple(message for lease in self.leases for message in lease.messages)


def reserve_queues(
    sources: Sequence[tuple[str, str | None]],
    limit: int,
    lease_seconds: float | None,
    *,
    max_deliveries: int | None = None,
) -> Call[MultiLease]:
    """Reserve up to ``limit`` pending messages of several queues, in strict order.

    ``reserve_queues.lua``: ``sources`` are (queue, dead-letter queue or
    None) pairs; the first queue's messages come first, then the second's,
    and so on. Each queue that gives messages gets its own token.
    """
    return Call(
        _multi_lease, "reserve_queues", _ordered_args(sources, limit, lease_seconds, max_deliveries)
    )


def _ordered_args(
    sources: Sequence[tuple[str, str | None]],
    limit: int,
    lease_seconds: float | None,
    max_deliveries: int | None,
) -> tuple[object, ...]:
    """Validate an ordered reservation; return its arguments (a fresh token prefix first)."""
    _check_limit(limit)
    return (
        new_token(),
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


def _multi_lease(raw: Any) -> MultiLease:
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


def settle(
    token: str, mode: SettleMode, target: str = "", ids: Iterable[int] | None = None
) -> Call[Settlement]:
    """``settle.lua``: claim, delete or move (to ``target``) IDs of a token (all when None)."""
    if mode not in ("claim", "delete", "move"):
        raise ValueError("mode must be 'claim', 'delete' or 'move'")
    if target:
        validate_queue_name(target)
    return Call(_settlement, "settle", (token, mode, target, *id_args(ids)))


def _settlements(raw: Any) -> list[Settlement]:
    return [Settlement(int(raw[i]), int(raw[i + 1])) for i in range(0, len(raw), 2)]


def commit(
    writes: Sequence[ValueWrite], settlements: Sequence[SettleGroup]
) -> Call[list[Settlement]]:
    """``commit.lua``: store ``writes``, then settle each group; one Settlement per group."""
    args: list[object] = [len(writes)]
    for write in writes:
        args += (write.value, "" if write.px is None else write.px)
    for group in settlements:
        args += (group.token, group.mode, group.target, len(group.ids), *id_args(group.ids))
    keys = tuple(write.key for write in writes)
    return Call(_settlements, "commit", tuple(args), extra_keys=keys)


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
    return Call(_int, "release", (token, delay, _flag(undeliver), *id_args(ids)))


def _tokens(raw: Any) -> set[str]:
    return {str(token) for token in raw}


def renew(tokens: Iterable[str], lease_seconds: float | None = None) -> Call[set[str]]:
    """Extend the leases of ``tokens``; return the tokens that no longer exist.

    ``renew.lua``; ``lease_seconds`` None renews each token for its own lease.
    """
    lease = "" if lease_seconds is None else lease_microseconds(lease_seconds)
    return Call(_tokens, "renew", (lease, *tokens))


def _recovery(raw: Any) -> Recovery:
    return Recovery(released=int(raw[0]), tokens=int(raw[1]), more=bool(int(raw[2])))


def recover(queue: str | None = None, *, max_tokens: int = 256) -> Call[Recovery]:
    """Release expired reservations (of ``queue`` or every queue); ``recover.lua``."""
    if queue is not None:
        validate_queue_name(queue)
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError("max_tokens must be an integer >= 1")
    return Call(_recovery, "recover", (queue or "", max_tokens))


# -- dead-letter journal -------------------------------------------------------------
#: Cursor of the dead-letter journal before its first entry.
JOURNAL_START = "0-0"

_ENTRY_ID_RE = re.compile(r"^\d{1,20}-\d{1,20}$")


def _entry_id(value: str) -> str:
    if not isinstance(value, str) or not _ENTRY_ID_RE.fullmatch(value):
        raise ValueError(f"not a journal entry ID: {value!r}")
    return value


def dead_letters(
    queues: Iterable[str], *, after: str = JOURNAL_START, limit: int = 256
) -> Call[DeadLetterPage]:
    """``dead_letters.lua``: journal entries after ``after`` of messages from ``queues``.

    Scans at most ``limit`` entries; the page's ``cursor`` is where to go on.
    """
    names = [validate_queue_name(queue) for queue in queues]
    if not names:
        raise ValueError("queues cannot be empty")
    _check_limit(limit)
    cursor = _entry_id(after)

    def parse(raw: Any) -> DeadLetterPage:
        entries = tuple(
            DeadLetterEntry(
                entry=str(raw[i]),
                queue=str(raw[i + 1]),
                dead_letter_queue=str(raw[i + 2]),
                id=int(raw[i + 3]),
                deliveries=int(raw[i + 4]),
                body=raw[i + 5],
            )
            for i in range(2, len(raw), 6)
        )
        return DeadLetterPage(entries, str(raw[0]) or cursor, bool(int(raw[1])))

    return Call(parse, "dead_letters", (cursor, limit, *names), idempotent=True)


def dead_letter_ack(entry: str, value: ValueWrite | None = None) -> Call[DeadLetterAck]:
    """``dead_letter_ack.lua``: take ``entry`` out of the journal, storing ``value`` if absent.

    ``acked`` is True for exactly one of any number of calls for one entry.
    """
    args: tuple[object, ...] = (_entry_id(entry), "", "")
    keys: tuple[str, ...] = ()
    if value is not None:
        args = (entry, value.value, "" if value.px is None else value.px)
        keys = (value.key,)

    def parse(raw: Any) -> DeadLetterAck:
        return DeadLetterAck(acked=bool(int(raw[0])), stored=bool(int(raw[1])))

    return Call(parse, "dead_letter_ack", args, extra_keys=keys)


# -- Taskiq schedules -----------------------------------------------------------------
ScheduleKind = Literal["time", "cron", "interval", "retry"]


def _claimed(raw: Any) -> str | None:
    return str(raw[0]) if raw else None


def schedule_claim(
    schedule_id: str, kind: ScheduleKind, run: str | int, lease_seconds: float
) -> Call[str | None]:
    """``schedule_claim.lua``: claim one due run of a schedule; its name, or None if not ours.

    ``run`` is the minute (since the epoch, UTC) for ``cron``, the interval
    in microseconds for ``interval``, the lost run's name for ``retry`` and
    ignored for ``time``.
    """
    if kind not in ("time", "cron", "interval", "retry"):
        raise ValueError(f"unknown schedule kind {kind!r}")
    lease = lease_microseconds(lease_seconds)
    if lease <= 0:
        raise ValueError("lease_seconds must be > 0")
    text = "" if kind == "time" else str(run)
    return Call(_claimed, "schedule_claim", (schedule_id, kind, text, lease))


def schedule_sent(schedule_id: str, run: str) -> Call[bool]:
    """``schedule_sent.lua``: confirm a claimed run was sent; False if its claim was gone."""
    return Call(_bool, "schedule_sent", (schedule_id, run))


def _table(raw: Any) -> ScheduleTable:
    stored, lost = raw
    return ScheduleTable(
        schedules={str(stored[i]): str(stored[i + 1]) for i in range(0, len(stored), 2)},
        lost=tuple(
            LostRun(str(lost[i]), str(lost[i + 1]), str(lost[i + 2]), int(lost[i + 3]))
            for i in range(0, len(lost), 4)
        ),
    )


def schedule_list() -> Call[ScheduleTable]:
    """``schedule_list.lua``: every stored schedule, and the runs claimed but never sent."""
    return Call(_table, "schedule_list", (), idempotent=True)


# -- Celery (celery_simplebroker): exchange tables and chords ------------------------------
@dataclass(frozen=True, slots=True)
class BindingRecord:
    """One binding to store: its name, JSON value, and lifetime (ms, 0: forever)."""

    name: str  #: ``"<exchange> US <routing key> US <queue>"``
    value: str
    lifetime_ms: int


@dataclass(frozen=True, slots=True)
class ExchangeTable:
    """The live bindings of an exchange, and expired ones (any exchange) just removed."""

    live: tuple[tuple[str, str], ...]  #: (binding, JSON value)
    removed: tuple[str, ...]  #: binding names


@dataclass(frozen=True, slots=True)
class ChordPart:
    """Outcome of counting one finished chord header entry."""

    seen: int  #: header entries counted so far (-1: the body was dispatched already)
    dispatch: bool  #: this call must dispatch the body
    #: For the call that must: every entry's (part, result), in no particular order.
    results: tuple[tuple[str, str], ...] = ()

    @property
    def done(self) -> bool:
        """Return True when the chord's body was dispatched already."""
        return self.seen < 0


@dataclass(frozen=True, slots=True)
class ChordDispatch:
    """Outcome of committing a chord's dispatch."""

    committed: bool  #: False: the chord was done already; nothing was written
    ids: tuple[int, ...]  #: IDs of the messages written, in argument order


def _binding_keys(keys: Keyspace) -> tuple[str, str]:
    return keys.celery_bindings, keys.celery_binding_deadlines


def _lifetime(lifetime_ms: int) -> int:
    if isinstance(lifetime_ms, bool) or not isinstance(lifetime_ms, int) or lifetime_ms < 0:
        raise ValueError("a lifetime must be an integer number of milliseconds >= 0")
    return lifetime_ms


def celery_bind(keys: Keyspace, bindings: Iterable[BindingRecord]) -> Call[int]:
    """``celery_bind.lua``: store bindings, (re)starting the lifetime of expiring ones."""
    args: list[object] = []
    for binding in bindings:
        args += (binding.name, binding.value, _lifetime(binding.lifetime_ms))
    return Call(_int, "celery_bind", tuple(args), extra_keys=_binding_keys(keys))


def _exchange_table(raw: Any) -> ExchangeTable:
    count = int(raw[0])
    live = tuple((str(raw[i]), str(raw[i + 1])) for i in range(1, 2 * count + 1, 2))
    return ExchangeTable(live, tuple(str(name) for name in raw[2 * count + 1 :]))


def celery_exchange_table(keys: Keyspace, exchange: str) -> Call[ExchangeTable]:
    """``celery_exchange_table.lua``: an exchange's live bindings; expired ones removed."""
    return Call(
        _exchange_table, "celery_exchange_table", (exchange,), extra_keys=_binding_keys(keys)
    )


def celery_unbind(keys: Keyspace, queue: str) -> Call[int]:
    """``celery_unbind.lua``: remove every binding of the Celery queue ``queue``."""
    return Call(_int, "celery_unbind", (queue,), extra_keys=_binding_keys(keys))


def _chord_part(raw: Any) -> ChordPart:
    pairs = tuple((str(raw[i]), str(raw[i + 1])) for i in range(2, len(raw) - 1, 2))
    return ChordPart(int(raw[0]), bool(int(raw[1])), pairs)


def _chord_size(size: int) -> int:
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise ValueError("a chord's size must be an integer >= 0")
    return size


def celery_chord_size(keys: Keyspace, chord: str, size: int, lifetime_ms: int) -> Call[int]:
    """``celery_chord_size.lua``: ``chord`` completes after ``size`` entries; a new run."""
    args = (_chord_size(size), _lifetime(lifetime_ms))
    return Call(_int, "celery_chord_size", args, extra_keys=keys.celery_chord(chord))


def celery_chord_add(keys: Keyspace, chord: str, lifetime_ms: int) -> Call[int]:
    """``celery_chord_add.lua``: ``chord`` waits for one more header entry."""
    args = (_lifetime(lifetime_ms),)
    return Call(_int, "celery_chord_add", args, extra_keys=keys.celery_chord(chord))


def celery_chord_part(
    keys: Keyspace, chord: str, part: str, result: str, size: int, lifetime_ms: int
) -> Call[ChordPart]:
    """``celery_chord_part.lua``: record header entry ``part`` of ``chord`` with its result.

    ``chord`` is Celery's key name; ``size`` is used only while no
    :func:`celery_chord_size` was stored (0: unknown, nothing dispatches).
    """
    if not part:
        raise ValueError("part must not be empty")
    args = (part, result, _chord_size(size), _lifetime(lifetime_ms))
    return Call(_chord_part, "celery_chord_part", args, extra_keys=keys.celery_chord(chord))


def _chord_dispatch(raw: Any) -> ChordDispatch:
    return ChordDispatch(bool(int(raw[0])), tuple(int(value) for value in raw[1:]))


def celery_chord_dispatch(
    keys: Keyspace,
    chord: str,
    part: str,
    lifetime_ms: int,
    messages: Sequence[tuple[str, str]],
    candidate: int | None,
) -> Call[ChordDispatch]:
    """Write (queue, body) ``messages`` and mark ``chord`` done, or nothing; one step.

    ``celery_chord_dispatch.lua``. ``part`` must hold the chord's dispatch
    claim; ``candidate`` is the first message's candidate ID (None exactly
    when there is no message).
    """
    if not part:
        raise ValueError("part must not be empty")
    if (candidate is None) != (not messages):
        raise ValueError("a candidate ID is needed exactly when there are messages")
    first = "" if candidate is None else format_id(candidate)
    args: list[object] = [part, _lifetime(lifetime_ms), first]
    for queue, body in messages:
        args += (validate_queue_name(queue), body)
    return Call(
        _chord_dispatch, "celery_chord_dispatch", tuple(args), extra_keys=keys.celery_chord(chord)
    )


@dataclass(frozen=True, slots=True)
class CeleryStored:
    """Outcome of ``celery_store.lua``: the entry, and the acknowledgement it carried."""

    stored: int  #: 1 stored, 0 kept (the task had succeeded), -1 nothing done
    settlement: Settlement  #: of the acknowledged message (0, 0 when none was named)
    #: The next messages reserved with it (``reserve_from``); None when not asked or stored is -1.
    reserved: MultiLease | None = None


def _celery_stored(raw: Any) -> CeleryStored:
    reserved = _multi_lease(raw[3:]) if len(raw) > 3 else None
    return CeleryStored(int(raw[0]), Settlement(int(raw[1]), int(raw[2])), reserved)


def celery_store(
    keys: Keyspace,
    name: str,
    value: str,
    expires_ms: int | None,
    wake: str | None,
    *,
    guard: bool,
    ack: tuple[str, int] | None = None,
    reserve_from: Sequence[tuple[str, str | None]] = (),
    reserve_limit: int = 0,
    lease_seconds: float | None = None,
    max_deliveries: int | None = None,
) -> Call[CeleryStored]:
    """Store the Celery result backend's entry ``name`` and publish ``wake``'s wake-up.

    ``celery_store.lua``. With ``guard`` an entry whose JSON says SUCCESS is
    kept. ``ack`` = (token, message ID) also deletes that reserved message in
    the same step (a worker's acknowledgement of the task whose result this
    is). ``stored`` is 1 stored, 0 kept, -1 when the guard could not read
    the stored entry (nothing done, nor acknowledged).

    With ``ack``, ``reserve_from`` (as :func:`reserve_queues`' ``sources``)
    also reserves up to ``reserve_limit`` of their pending messages in the
    same step (``reserved``): the worker's next batch.
    """
    if expires_ms is not None:
        _lifetime(expires_ms)
    args: tuple[object, ...] = (
        value,
        "" if not expires_ms else expires_ms,
        "" if wake is None else validate_queue_name(wake),
        _flag(guard),
    )
    if ack is not None:
        token, message_id = ack
        if not token:
            raise ValueError("token must not be empty")
        args += (token, format_id(int(message_id)))
    if reserve_from:
        if ack is None:
            raise ValueError("reserving with a result needs its acknowledgement")
        args += _ordered_args(reserve_from, reserve_limit, lease_seconds, max_deliveries)
    return Call(_celery_stored, "celery_store", args, extra_keys=(keys.celery_entry(name),))
