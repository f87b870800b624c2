"""The :class:`Call` every builder returns, and the argument helpers they share."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from ..keys import format_id
from ..scripts import READ_ONLY, ScriptName
from ..validation import finite_number

R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Call(Generic[R]):
    """One script run: name, arguments, and the parser of its reply.

    ``command`` instead of ``script`` runs plain commands (a function of
    the client, sync or asyncio alike; one command when ``writes``).
    ``idempotent`` calls change nothing and may be retried once after a
    connection error. ``writes`` marks a plain command that changes data:
    with the durability options it is followed by WAIT/WAITAOF, as every
    state-changing script is. A call is data: a runner runs it
    (``runner.run(call)``, awaited on an asyncio runner).
    """

    parse: Callable[[Any], R]
    script: ScriptName | None = None
    args: tuple[object, ...] = ()
    extra_keys: tuple[str, ...] = ()
    command: Callable[[Any], Any] | None = None
    idempotent: bool = False
    writes: bool = False  #: a plain command that changes data (see above)

    @property
    def changes(self) -> bool:
        """Return whether the call changes data: a writing script, or a command marked ``writes``.

        ``init`` does not count: creating a namespace twice is harmless. A
        change is what WAIT/WAITAOF follow, and what a lost reply leaves
        unknown (:class:`~simplebroker_redis.errors.OutcomeUnknown`).
        """
        if self.idempotent:
            return False
        if self.script is None:
            return self.writes
        return self.script not in READ_ONLY and self.script != "init"


# -- arguments ------------------------------------------------------------------------
#: What a holder (see :func:`new_token`) may be: lower-case hex.
_HOLDER_RE = re.compile(r"^[0-9a-f]{1,32}$")


def new_holder() -> str:
    """Return a fresh holder: the name of one worker's reservations (16 hex digits)."""
    return uuid.uuid4().hex[:16]


def new_token(holder: str | None = None) -> str:
    """Return a fresh reservation token, ``<holder>.<random>`` when it has a holder.

    A token that names its holder is spared by the recovery step that opens
    that holder's own reservations (``lua/lib/upkeep.lua``): a worker's
    reservation that reaches the server after a partition must not recover
    the leases the same worker is about to renew.
    """
    token = uuid.uuid4().hex
    if holder is None:
        return token
    if not isinstance(holder, str) or not _HOLDER_RE.match(holder):
        raise ValueError(f"a holder is 1-32 lower-case hex digits, not {holder!r}")
    return f"{holder}.{token}"


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


def flag(value: bool) -> str:
    """Return a boolean as the scripts read it: ``'1'`` or ``'0'``."""
    return "1" if value else "0"


def check_limit(limit: int) -> None:
    """Raise ValueError unless ``limit`` (of messages or entries per call) is an int >= 1."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError("limit must be an integer >= 1")


# -- replies ----------------------------------------------------------------------------
def parse_bool(raw: Any) -> bool:
    """Read a script's 1/0 reply."""
    return bool(int(raw))
