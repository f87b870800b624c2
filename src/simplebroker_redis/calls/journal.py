"""Calls of the dead-letter journal: read it after a cursor, and take entries out.

Every script that dead-letters a message after its last delivery also
appends an entry to the journal (a stream), so that an integration
reports each dead letter once (``dead_letter_ack``'s ``acked``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, Final

from ..types import DeadLetterAck, DeadLetterEntry, DeadLetterPage, ValueWrite
from ..validation import validate_queue_name
from .base import Call, check_limit

#: Cursor of the dead-letter journal before its first entry.
JOURNAL_START: Final[str] = "0-0"

#: A stream entry ID, ``<milliseconds>-<sequence>``.
_ENTRY_ID_RE: Final = re.compile(r"^\d{1,20}-\d{1,20}$")


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
    check_limit(limit)
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
