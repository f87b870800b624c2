"""The values the typed calls take and return: one import path for each.

Every reply of a script (:mod:`.calls`) is one of these frozen dataclasses,
and the few argument shapes the calls share are the aliases below (a
framework's own replies live in its room: :mod:`.calls.celery`,
:mod:`.calls.schedules` for Taskiq, :mod:`.calls.dramatiq`). They
live here, apart from the builders, so the reservation API, the
integrations and the tools name them from one place
(``from simplebroker_redis.types import Lease``); the package's top level
re-exports its public few (``Lease``, ``LeasedMessage``, ``Recovery``,
``Settlement``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Row = tuple[str, int]  #: (body, id), SimpleBroker's row shape
#: What a settlement does with a token's IDs: claim, delete, or move to a target.
SettleMode = Literal["claim", "delete", "move"]
#: What ``claim.lua`` does with the messages it takes.
TakeMode = Literal["claim", "move"]
#: A state of a queue's messages as ``inspect.lua`` reports it.
State = Literal["pending", "delayed", "reserved"]


# -- reservations ---------------------------------------------------------------------
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


@dataclass(frozen=True, slots=True)
class Settlement:
    """Outcome of ack/reject: IDs settled, and IDs the token no longer held."""

    settled: int
    lost: int


@dataclass(frozen=True, slots=True)
class SettleGroup:
    """One settlement of the ``commit`` script: IDs of a token, and what to do."""

    token: str
    mode: SettleMode
    target: str  #: the queue a ``move`` sends them to ('' for the other modes)
    ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Dedupe:
    """A write's idempotency key: its Redis key and how long (ms) it is kept.

    A write carrying one stores its message only if no write with the same
    key did within the window; otherwise it changes nothing and returns the
    first write's ID. Build it with :func:`simplebroker_redis.calls.dedupe`.
    """

    key: str
    window_ms: int


@dataclass(frozen=True, slots=True)
class ValueWrite:
    """A value to ``SET`` in the ``commit`` script (a task result), expiry in ms.

    ``fence``: (token, message ID) of the reservation whose task produced
    the value; ``commit`` stores it only while that token still holds that
    message (a worker whose lease was taken over cannot overwrite the
    result of the one that holds it now). None: stored unconditionally.
    """

    key: str
    value: str
    px: int | None
    fence: tuple[str, int] | None = None


@dataclass(frozen=True, slots=True)
class Committed:
    """What one ``commit`` did: results refused by their fence, and each settlement."""

    refused: int  #: fenced results not stored (the token no longer held the message)
    settlements: tuple[Settlement, ...]  #: one per settlement group, in order


@dataclass(frozen=True, slots=True)
class Recovery:
    """Outcome of a recovery pass."""

    released: int  #: live message IDs made pending again (or dead-lettered)
    tokens: int  #: expired reservations recovered
    more: bool  #: True when more expired reservations may remain


@dataclass(frozen=True, slots=True)
class Renewal:
    """Outcome of a renewal: the server's time when it ran, and the tokens gone.

    Every renewed lease's deadline is ``now_ns`` plus its lease, on the
    server's clock.
    """

    now_ns: int  #: server time of the renewal (ns, microsecond precision)
    lost: frozenset[str]  #: tokens that no longer exist (settled, released, recovered)


# -- writes ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Broadcast:
    """Outcome of a broadcast: copies written and the first and last IDs."""

    count: int
    first: int
    last: int


# -- the dead-letter journal ----------------------------------------------------------
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


# -- operations: the exporter, the dashboard, worker beats ----------------------------
@dataclass(frozen=True, slots=True)
class QueueDepth:
    """One queue's depth per state, and its oldest pending message."""

    queue: str
    pending: int  #: claimable now
    reserved: int  #: held by a live reservation (in flight)
    delayed: int  #: pending, but not claimable before a due time
    claimed: int  #: consumed, awaiting vacuum
    oldest_pending_us: int | None  #: when the oldest pending message was written


@dataclass(frozen=True, slots=True)
class WorkerRecord:
    """A worker process as its last heartbeat described it."""

    id: str
    beat_us: int  #: server time of the last beat
    info: dict[str, Any]  #: what the worker said about itself (JSON)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A page of the namespace's queues, read in one script run."""

    now_us: int  #: server time of the read
    cursor: str  #: read on after this queue ('' when the last page)
    dead_letter_targets: tuple[str, ...]  #: dead-letter queues of live reservations
    queues: tuple[QueueDepth, ...]
    workers: tuple[WorkerRecord, ...] = field(default=())
    counters: dict[tuple[str, str], int] = field(default_factory=dict)  #: (queue, event) -> n


@dataclass(frozen=True, slots=True)
class MessageView:
    """One message as the dashboard shows it."""

    id: int
    body: str  #: at most ``calls.operations.BODY_PREVIEW`` bytes of it
    size: int  #: the whole body's length
    deliveries: int
    until_us: int | None  #: due time (delayed) or lease deadline (reserved)
    token: str  #: the reservation holding it ('' unless reserved)


@dataclass(frozen=True, slots=True)
class StateView:
    """The first messages of one state of a queue, and how many there are."""

    state: State
    count: int  #: messages in this state, those not shown included
    messages: tuple[MessageView, ...]


@dataclass(frozen=True, slots=True)
class JournalEntry:
    """A dead-letter journal entry of a message now in the inspected queue."""

    id: int
    queue: str  #: where it was reserved from
    deliveries: int  #: the deliveries it had used up
    entry: str  #: the journal entry ID


@dataclass(frozen=True, slots=True)
class QueueView:
    """What ``inspect`` read of one queue."""

    now_us: int
    states: tuple[StateView, ...]
    journal: tuple[JournalEntry, ...]


# -- tasks (the dashboard's task views) ------------------------------------------------
#: Where ``task_find.lua`` found a message ('moved': stored, in none of the
#: queues looked in; 'gone': an index entry without its message).
Place = Literal["pending", "delayed", "reserved", "claimed", "moved", "gone"]


@dataclass(frozen=True, slots=True)
class TaskLocation:
    """One message ``task_find.lua`` located: by a task index key, or by (queue, id)."""

    what: str  #: ``"k:<framework>:<task id>"`` or ``"m:<queue>"`` (what was asked)
    id: int
    written_to: str  #: the queue the message was written to (or the one asked)
    state: Place
    queue: str  #: the queue holding it now ('' when moved or gone)
    deliveries: int
    until_us: int | None  #: due time (delayed) or lease deadline (reserved)
    token: str  #: the reservation holding it ('' unless reserved)
    reserved_us: int | None  #: when that reservation was made
    body: str  #: the body, cut to the preview length asked for
    size: int  #: the whole body's length


@dataclass(frozen=True, slots=True)
class TaskLookup:
    """What ``task_find.lua`` answered."""

    now_us: int
    found: tuple[TaskLocation, ...]
    results: tuple[str, ...]  #: the value of each result key asked for ('' none)


@dataclass(frozen=True, slots=True)
class RunningMessage:
    """A message in flight (reserved), as ``running.lua`` reports it."""

    queue: str
    id: int
    token: str
    reserved_us: int  #: when its reservation was made (server time)
    deadline_us: int | None  #: its lease deadline, None: never expires
    deliveries: int
    body: str  #: cut to the preview length asked for
    size: int


@dataclass(frozen=True, slots=True)
class Running:
    """Every queue's messages in flight (the first ones, and how many in all)."""

    now_us: int
    total: int
    messages: tuple[RunningMessage, ...]


@dataclass(frozen=True, slots=True)
class TaskStatsPage:
    """Task records read by ``task_stats_read.lua`` (see :mod:`..taskrecord`)."""

    now_us: int
    minutes: tuple[tuple[int, str, str], ...]  #: (minute since the epoch, task name, record)
    totals: dict[str, str]  #: task name -> record since the namespace began
