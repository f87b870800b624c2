"""Input validation shared by the core and the reservation API."""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Final

from simplebroker.ext import MessageError, QueueNameError

from .keys import format_id

_QUEUE_NAME_RE: Final = re.compile(r"^[a-zA-Z0-9_][a-zA-Z0-9_.-]*$")
_MAX_QUEUE_NAME_LENGTH: Final[int] = 512


@lru_cache(maxsize=4096)
def _queue_name_error(queue: object) -> str | None:
    if not isinstance(queue, str) or not queue:
        return "Invalid queue name: cannot be empty"
    if len(queue) > _MAX_QUEUE_NAME_LENGTH:
        return f"Invalid queue name: exceeds {_MAX_QUEUE_NAME_LENGTH} characters"
    if not _QUEUE_NAME_RE.fullmatch(queue):
        return (
            "Invalid queue name: must contain only letters, numbers, periods, "
            "underscores, and hyphens. Cannot begin with a hyphen or a period"
        )
    return None


def validate_queue_name(queue: object) -> str:
    """Return ``queue`` if it is a valid queue name, else raise QueueNameError."""
    if not isinstance(queue, str):
        raise QueueNameError("Invalid queue name: must be a string")
    error = _queue_name_error(queue)
    if error is not None:
        raise QueueNameError(error)
    return queue


def optional_id(value: int | None) -> str:
    """Return the 19-digit form of an optional bound ('' for None)."""
    return "" if value is None else format_id(value)


def validate_message(message: object, max_size: int) -> str:
    """Return ``message`` if it is UTF-8 text of at most ``max_size`` bytes."""
    if not isinstance(message, str):
        raise MessageError("Message body must be a string")
    try:
        size = len(message.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise MessageError(
            "Message must be UTF-8 encodable (lone surrogates are not allowed)"
        ) from exc
    if size > max_size:
        raise MessageError(
            f"Message size ({size} bytes) exceeds maximum allowed size "
            f"({max_size} bytes). Adjust BROKER_MAX_MESSAGE_SIZE if needed."
        )
    return message
