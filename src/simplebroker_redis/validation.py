"""Input validation shared by the core and the reservation API."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from functools import lru_cache
from typing import Any, Final, Literal

from simplebroker import resolve_config
from simplebroker.ext import MessageError, QueueNameError

from .environment import environment_config
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


def number_problem(
    value: object, *, bound: float | None = None, side: Literal[">", ">="] = ">="
) -> str | None:
    """Return what ``value`` should have been, or None when it is a fine number.

    A fine number is an ``int`` or ``float`` (not a ``bool``), finite, and
    ``side bound`` when a bound is given. The answer completes a sentence
    such as ``f"lease_seconds must be {problem}"``: ``"a number"``,
    ``"a finite number"`` or ``"a finite number > 0"``. Every numeric
    setting of the backend and its integrations is checked here, so they
    refuse the same values in the same words; each caller raises its own
    exception type.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "a number"
    expected = "a finite number" if bound is None else f"a finite number {side} {bound:g}"
    if not math.isfinite(value):
        return expected
    if bound is not None and (value <= bound if side == ">" else value < bound):
        return expected
    return None


def finite_number(
    value: object,
    name: str,
    *,
    bound: float | None = None,
    side: Literal[">", ">="] = ">=",
) -> float:
    """Return ``value`` as a float, or raise what Python raises for a bad argument.

    TypeError when it is no number, ValueError when it is not finite or
    outside ``side bound`` (see :func:`number_problem`).
    """
    problem = number_problem(value, bound=bound, side=side)
    if problem is None:
        return float(value)  # type: ignore[arg-type] # checked above
    error = TypeError if problem == "a number" else ValueError
    raise error(f"{name} must be {problem}")


def optional_id(value: int | None) -> str:
    """Return the 19-digit form of an optional bound ('' for None)."""
    return "" if value is None else format_id(value)


def message_size_limit(config: Mapping[str, Any] | None) -> int:
    """Return the largest message a writer accepts: one rule for every entry point.

    ``MAX_MESSAGE_SIZE`` of SimpleBroker's ``config``; without a config, of
    the environment (``BROKER_MAX_MESSAGE_SIZE``), as the ``broker`` command
    reads it; SimpleBroker's default (10 MB) when neither sets it. The
    runners, the core and every integration's writes take their limit here.
    """
    source = environment_config() if config is None else config
    limit = source.get("MAX_MESSAGE_SIZE")
    return int(resolve_config()["MAX_MESSAGE_SIZE"] if limit is None else limit)


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


#: Longest task index key (``"<framework>:<task id>"``) a write may carry.
MAX_TASK_KEY: Final[int] = 512


def check_task_key(key: object) -> str:
    """Return ``key`` if it is a usable task index key ('' for none), else raise ValueError."""
    if not isinstance(key, str):
        raise TypeError("a task key must be a string")
    if len(key) > MAX_TASK_KEY:
        raise ValueError(f"a task key holds at most {MAX_TASK_KEY} characters")
    return key
