"""The bodies this provider stores, and how they are read back.

- A **log entry** (``<prefix>.<stream>``) is the published message as JSON,
  exactly what ``broker peek`` shows; its SimpleBroker ID is the message's
  Protean identifier.
- A **group copy** (``<prefix>.<stream>--<group>``) wraps a log entry with
  that identifier: ``{"id":"<log id>","message":<log entry>}``. Copies get
  IDs of their own (a SimpleBroker ID names one message), so the wrapper is
  what lets every group report the identifier ``publish`` returned.
- A group's **registration** (the oldest message of its ``--at`` queue)
  names the stream and group; beside it, ``{"at":"<log id>"}`` records how
  far the group has copied the log (the newest one counts).
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Final

#: Start of every registration body.
_REGISTRATION_MARK: Final[str] = '{"protean_group":'

#: Start of a copy: the log ID it wraps, then the log entry.
_ENVELOPE: Final = re.compile(r'^\{"id":"(\d{1,20})","message":')

#: Bytes a copy adds to the log entry it wraps (with a 20-digit ID).
ENVELOPE_OVERHEAD: Final[int] = len('{"id":"","message":}') + 20


class CorruptMessage(ValueError):
    """A stored body is not what this provider writes."""


#: What a message ID must be to serve as an idempotency key: printable ASCII
#: without spaces (the backend's rule for keys).
_KEY: Final = re.compile(r"^[!-~]{1,200}$")


def log_key(log: str, message_id: str) -> str | None:
    """Return the idempotency key of message ``message_id`` in the log queue ``log``.

    Protean documents a message's ID (``metadata.headers.id``) as its
    idempotency key; None without a usable one (empty, or not printable
    ASCII without spaces). Per log: the same message may go to two
    streams. A long pair is hashed, so the key stays within the backend's
    200 characters.
    """
    if not _KEY.match(message_id):
        return None
    combined = f"{log}:{message_id}"
    if len(combined) <= 200:
        return combined
    return "sha256:" + hashlib.sha256(combined.encode("utf-8")).hexdigest()


def serialize(message: dict[str, Any]) -> str:
    """Return the log entry of a published message (JSON, like Protean's Redis provider)."""
    return json.dumps(message)


def deserialize(body: str) -> dict[str, Any]:
    """Return the message of a log entry; raise :class:`CorruptMessage` for anything else."""
    try:
        value = json.loads(body)
    except ValueError as exc:
        raise CorruptMessage(f"not a JSON message: {exc}") from None
    if not isinstance(value, dict):
        raise CorruptMessage("not a JSON object")
    return value


def envelope(log_id: int, body: str) -> str:
    """Return the group copy of the log entry ``body`` stored under ``log_id``."""
    return f'{{"id":"{log_id}","message":{body}}}'


def envelope_id(body: str) -> int | None:
    """Return the log ID a copy wraps, without parsing its message; None if not a copy."""
    found = _ENVELOPE.match(body)
    return int(found.group(1)) if found else None


def open_envelope(body: str) -> tuple[str, dict[str, Any]]:
    """Return ``(identifier, message)`` of a group copy."""
    found = _ENVELOPE.match(body)
    if found is None or not body.endswith("}"):
        raise CorruptMessage("not a group copy")
    return found.group(1), deserialize(body[found.end() : -1])


#: Start of a position record: the log ID a group has copied up to.
_POSITION = re.compile(r'^\{"at":"(\d{1,20})"\}$')


def position_record(log_id: int) -> str:
    """Return the record of a group having copied the log up to ``log_id``."""
    return f'{{"at":"{log_id}"}}'


def position_of(body: str) -> int | None:
    """Return the log ID of a position record; None for any other body."""
    found = _POSITION.match(body)
    return int(found.group(1)) if found else None


def registration(stream: str, group: str) -> str:
    """Return the body that registers ``group`` on ``stream``."""
    return _REGISTRATION_MARK + json.dumps(group) + ',"stream":' + json.dumps(stream) + "}"


def is_registration(body: str) -> bool:
    """Return whether ``body`` is a group registration."""
    return body.startswith(_REGISTRATION_MARK)
