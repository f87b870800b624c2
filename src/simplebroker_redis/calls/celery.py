"""Celery's room (celery_simplebroker): its calls, keys and reply types.

Its scripts are ``lua/celery/`` (exchange tables, chords, results). Unlike
the queue scripts, these touch keys beyond the fixed ones (the exchange
tables, a chord's keys, a result entry): they are named here, under the
namespace's ``celery:`` prefix (:meth:`~simplebroker_redis.keys.Keyspace.celery`),
and the builders pass them as extra ``KEYS``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..keys import Keyspace, format_id
from ..types import MultiLease, Settlement
from ..validation import validate_queue_name
from .base import Call, flag
from .leases import ordered_args, parse_multi_lease


# -- keys ---------------------------------------------------------------------------
def _binding_keys(keys: Keyspace) -> tuple[str, str]:
    """Return the hash of exchange bindings and the zset of their deadlines.

    The hash maps ``"<exchange> US <key> US <queue>"`` to JSON; the zset each
    binding of a queue that expires when unused to its expiry (server ms).
    """
    return keys.celery("bindings"), keys.celery("binding_deadlines")


def entry_key(keys: Keyspace, name: str) -> str:
    """Return the key of the Celery result backend's entry ``name``.

    ``name`` is Celery's own key name (``celery-task-meta-<id>``,
    ``celery-taskset-meta-<id>``, ``chord-unlock-<group>``).
    """
    return keys.celery(name)


def chord_keys(keys: Keyspace, name: str) -> tuple[str, str, str, str]:
    """Return the keys of a chord's state: (parts, dispatch claim, size, results).

    ``name`` is Celery's key name of the chord (``chord-unlock-<group>``).
    The parts set holds ``"<task id>:<header index>"`` of every finished
    header entry, the results hash maps each to its result; the claim
    string holds the member that dispatches the body, then ``done``; the
    size hash holds ``size`` (Celery's ``set_chord_size``) and ``extra``
    (``add_to_chord``).
    """
    parts = entry_key(keys, name)
    return parts, f"{parts}.dispatch", f"{parts}.size", f"{parts}.results"


# -- replies --------------------------------------------------------------------------
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


@dataclass(frozen=True, slots=True)
class CeleryStored:
    """Outcome of ``celery_store.lua``: the entry, and the acknowledgement it carried."""

    stored: int  #: 1 stored, 0 kept (the task had succeeded), -1 nothing done
    settlement: Settlement  #: of the acknowledged message (0, 0 when none was named)
    #: The next messages reserved with it (``reserve_from``); None when not asked or stored is -1.
    reserved: MultiLease | None = None


def _lifetime(lifetime_ms: int) -> int:
    if isinstance(lifetime_ms, bool) or not isinstance(lifetime_ms, int) or lifetime_ms < 0:
        raise ValueError("a lifetime must be an integer number of milliseconds >= 0")
    return lifetime_ms


# -- exchange tables ------------------------------------------------------------------
def celery_bind(keys: Keyspace, bindings: Iterable[BindingRecord]) -> Call[int]:
    """``celery_bind.lua``: store bindings, (re)starting the lifetime of expiring ones."""
    args: list[object] = []
    for binding in bindings:
        args += (binding.name, binding.value, _lifetime(binding.lifetime_ms))
    return Call(int, "celery_bind", tuple(args), extra_keys=_binding_keys(keys))


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
    return Call(int, "celery_unbind", (queue,), extra_keys=_binding_keys(keys))


# -- chords -----------------------------------------------------------------------------
def _chord_part(raw: Any) -> ChordPart:
    pairs = tuple((str(raw[i]), str(raw[i + 1])) for i in range(2, len(raw) - 1, 2))
    return ChordPart(int(raw[0]), bool(int(raw[1])), pairs)


def _chord_size(size: int) -> int:
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise ValueError("a chord's size must be an integer >= 0")
    return size


def celery_chord_size(keys: Keyspace, chord: str, size: int | None, lifetime_ms: int) -> Call[int]:
    """``celery_chord_size.lua``: a new run of ``chord``, complete after ``size`` entries.

    ``size`` None only starts the run (the size comes later).
    """
    args = ("" if size is None else _chord_size(size), _lifetime(lifetime_ms))
    return Call(int, "celery_chord_size", args, extra_keys=chord_keys(keys, chord))


def celery_chord_add(keys: Keyspace, chord: str, lifetime_ms: int) -> Call[int]:
    """``celery_chord_add.lua``: ``chord`` waits for one more header entry."""
    args = (_lifetime(lifetime_ms),)
    return Call(int, "celery_chord_add", args, extra_keys=chord_keys(keys, chord))


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
    return Call(_chord_part, "celery_chord_part", args, extra_keys=chord_keys(keys, chord))


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
        _chord_dispatch, "celery_chord_dispatch", tuple(args), extra_keys=chord_keys(keys, chord)
    )


# -- results ------------------------------------------------------------------------------
def _celery_stored(raw: Any) -> CeleryStored:
    reserved = parse_multi_lease(raw[3:]) if len(raw) > 3 else None
    return CeleryStored(int(raw[0]), Settlement(int(raw[1]), int(raw[2])), reserved)


def celery_store(
    keys: Keyspace,
    name: str,
    value: str,
    expires_ms: int | None,
    wake: str | None,
    *,
    guard: bool,
    fence: tuple[str, int] | None = None,
    ack: bool = False,
    reserve_from: Sequence[tuple[str, str | None]] = (),
    reserve_limit: int = 0,
    lease_seconds: float | None = None,
    max_deliveries: int | None = None,
    holder: str | None = None,
) -> Call[CeleryStored]:
    """Store the Celery result backend's entry ``name`` and publish ``wake``'s wake-up.

    ``celery_store.lua``. With ``guard`` an entry whose JSON says SUCCESS is
    kept. ``fence`` = (token, message ID) stores nothing unless that
    reservation still holds that message (``stored`` -2: its lease was
    taken over, or it was handed back); with ``ack`` the same step also
    deletes the message (a worker's acknowledgement of the task whose
    result this is). ``stored`` is 1 stored, 0 kept, -1 when the guard
    could not read the stored entry (nothing done, nor acknowledged).

    With ``ack``, ``reserve_from`` (as :func:`.leases.reserve_queues`'
    ``sources``) also reserves up to ``reserve_limit`` of their pending
    messages in the same step (``reserved``): the worker's next batch,
    under tokens naming ``holder`` (its own reservations are spared by the
    step's recovery, as in :func:`.leases.reserve_queues`).
    """
    if expires_ms is not None:
        _lifetime(expires_ms)
    args: tuple[object, ...] = (
        value,
        "" if not expires_ms else expires_ms,
        "" if wake is None else validate_queue_name(wake),
        flag(guard),
    )
    if ack and fence is None:
        raise ValueError("an acknowledgement with a result needs the message it fences")
    if fence is not None:
        token, message_id = fence
        if not token:
            raise ValueError("token must not be empty")
        args += ("ack" if ack else "fence", token, format_id(int(message_id)))
    if reserve_from:
        if not ack:
            raise ValueError("reserving with a result needs its acknowledgement")
        args += ordered_args(reserve_from, reserve_limit, lease_seconds, max_deliveries, holder)
    return Call(_celery_stored, "celery_store", args, extra_keys=(entry_key(keys, name),))
