"""How the dashboard reads Celery's stored tasks and results (the ``celery`` task format).

A Celery task's message is a kombu envelope (:mod:`.envelope`): JSON whose
``headers`` (task protocol 2) carry the task's ``id``, its name (``task``),
``argsrepr``/``kwargsrepr`` and ``retries``, and whose ``properties``
carry the routing key it was sent with. Its outcome is the result backend's
``celery-task-meta-<id>`` entry (``status``, ``result``, ``traceback``).
Registered under the entry point group ``simplebroker_redis.task_formats``;
see :mod:`simplebroker_redis.tasks.formats`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Final

from simplebroker_redis.calls import celery as celery_calls
from simplebroker_redis.keys import Keyspace
from simplebroker_redis.tasks import TaskFormat, TaskInfo, TaskOutcome
from simplebroker_redis.tasks.formats import field_text, load_json, shorten

from .entries import decode_value

#: The framework's name in task index keys and on the dashboard.
FRAMEWORK: Final[str] = "celery"


def task_headers(message: Any) -> tuple[str, str, int] | None:
    """Return (task id, task name, retries) of a kombu message dict, if it is a Celery task."""
    headers = message.get("headers") if isinstance(message, dict) else None
    if not isinstance(headers, dict) or not headers.get("id") or not headers.get("task"):
        return None
    try:
        retries = int(headers.get("retries") or 0)
    except (TypeError, ValueError):
        retries = 0
    return str(headers["id"]), str(headers["task"]), retries


class CeleryFormat(TaskFormat):
    """Celery task messages (kombu envelopes, protocol 2) and result backend entries."""

    framework: ClassVar[str] = FRAMEWORK

    def describe(self, body: str) -> TaskInfo | None:
        """Return the task of a kombu envelope (None for another framework's body)."""
        if '"headers"' not in body or '"task"' not in body:
            return None
        message = load_json(body)
        found = task_headers(message)
        if found is None:
            if message is not None:
                return None
            # Cut short (long arguments come first, in "body"): read the fields.
            task_id, name = field_text(body, "id"), field_text(body, "task")
            return TaskInfo(FRAMEWORK, task_id, name or "") if name else None
        task_id, name, _ = found
        headers = message["headers"]
        preview = " ".join(
            str(headers[part]) for part in ("argsrepr", "kwargsrepr") if headers.get(part)
        )
        info = message.get("properties", {}).get("delivery_info", {})
        origin = info.get("routing_key") if isinstance(info, dict) else None
        return TaskInfo(
            FRAMEWORK, task_id, name, shorten(preview), origin if isinstance(origin, str) else None
        )

    def result_keys(self, keys: Keyspace, task_id: str) -> Sequence[str]:
        """Return the result backend's entry of ``task_id``."""
        return (celery_calls.entry_key(keys, f"celery-task-meta-{task_id}"),)

    def outcome(self, value: str) -> TaskOutcome | None:
        """Return the outcome of a stored ``celery-task-meta`` entry (JSON)."""
        decoded = decode_value(value)
        meta = load_json(decoded) if isinstance(decoded, str) else None
        if not isinstance(meta, dict) or "status" not in meta:
            return None
        status = str(meta["status"])
        result = meta.get("result")
        if status in ("FAILURE", "RETRY", "REVOKED"):
            return TaskOutcome(
                status, error=_error_text(result), traceback=meta.get("traceback") or ""
            )
        return TaskOutcome(status, result=shorten(result))


def _error_text(error: Any) -> str:
    if isinstance(error, dict) and "exc_type" in error:
        message = error.get("exc_message")
        if isinstance(message, list):
            message = ", ".join(str(part) for part in message)
        return f"{error['exc_type']}: {message or ''}".strip()
    return shorten(error) if error is not None else ""
