"""How the dashboard reads Taskiq's stored tasks and results (the ``taskiq`` task format).

A kicked task's message is Taskiq's serialized ``BrokerMessage`` (JSON by
default: ``task_id`` and ``task_name`` come first, so even a body cut short
names them), stored through :mod:`.codec`; its result is the result
backend's ``result:<task id>`` (a ``TaskiqResult``: ``is_err``,
``return_value``, ``error``). Registered under the entry point group
``simplebroker_redis.task_formats``; see :mod:`simplebroker_redis.tasks.formats`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Final

from simplebroker_redis.keys import Keyspace
from simplebroker_redis.tasks import TaskFormat, TaskInfo, TaskOutcome
from simplebroker_redis.tasks.formats import field_text, load_json, shorten

from .codec import MARK, decode_body

#: The framework's name in task index keys and on the dashboard.
FRAMEWORK: Final[str] = "taskiq"


class TaskiqFormat(TaskFormat):
    """Taskiq messages (JSON-serialized) and ``TaskiqResult`` values."""

    framework: ClassVar[str] = FRAMEWORK

    def describe(self, body: str) -> TaskInfo | None:
        """Return the task of a Taskiq message body (None for another framework's)."""
        text = _text(body)
        if text is None or '"task_name"' not in text or '"task_id"' not in text:
            return None
        message = load_json(text)
        if isinstance(message, dict):
            args = {"args": message.get("args", []), "kwargs": message.get("kwargs", {})}
            labels = message.get("labels")
            origin = labels.get("queue_name") if isinstance(labels, dict) else None
            return TaskInfo(
                FRAMEWORK,
                str(message.get("task_id", "")) or None,
                str(message.get("task_name", "")),
                shorten(args),
                origin if isinstance(origin, str) else None,
            )
        # Cut short (a long argument list): the leading fields still name it.
        return TaskInfo(FRAMEWORK, field_text(text, "task_id"), field_text(text, "task_name") or "")

    def result_keys(self, keys: Keyspace, task_id: str) -> Sequence[str]:
        """Return the result backend's key of ``task_id``."""
        return (keys.result_key(task_id),)

    def outcome(self, value: str) -> TaskOutcome | None:
        """Return the outcome of a stored ``TaskiqResult`` (JSON)."""
        text = _text(value)
        result = load_json(text) if text is not None else None
        if not isinstance(result, dict) or "is_err" not in result:
            return None
        if not result.get("is_err"):
            return TaskOutcome("SUCCESS", result=shorten(result.get("return_value")))
        return TaskOutcome("FAILURE", error=_error_text(result.get("error")))


def _text(body: str) -> str | None:
    """Return a stored body as text (None: binary, another serializer's)."""
    if not body.startswith(MARK):
        return body
    try:
        return decode_body(body).decode("utf-8")
    except (ValueError, UnicodeDecodeError):
        return None


def _error_text(error: Any) -> str:
    """Return Taskiq's serialized exception as ``Type: message``."""
    if isinstance(error, dict):
        message = error.get("exc_message")
        if isinstance(message, list):
            message = ", ".join(str(part) for part in message)
        return f"{error.get('exc_type', 'Error')}: {message or ''}".strip()
    return shorten(error) if error is not None else "failed"
