"""How the dashboard reads Protean's stored messages (the ``protean`` task format).

Publishing writes a message to its stream's log: its SimpleBroker ID is the
identifier ``publish`` returns (a Protean message's id on the dashboard),
and it is indexed under Protean's own message id (``metadata.headers.id``)
when it has one. Each consumer group handles a *copy* in its own queue
(:mod:`.messages`: ``{"id":"<log id>","message":...}``), indexed under
:func:`copy_key`, so a message is found in every group in a few reads. A
Protean message's "task name" is its type (``metadata.headers.type``).
Protean stores no results: a message is done in a group once its copy is
gone. Registered under the entry point group
``simplebroker_redis.task_formats``; see :mod:`simplebroker_redis.tasks.formats`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Final

from simplebroker_redis.tasks import Lookups, TaskFormat, TaskInfo, index_key
from simplebroker_redis.tasks.formats import load_json, shorten

from .messages import envelope_id, open_envelope, position_of
from .names import SEP

#: The framework's name in task index keys and on the dashboard.
FRAMEWORK: Final[str] = "protean"


def message_type(message: Any) -> str:
    """Return a Protean message's type (its "task name"; '' when it has none)."""
    if not isinstance(message, dict):
        return ""
    metadata = message.get("metadata")
    if isinstance(metadata, dict):
        headers = metadata.get("headers")
        if isinstance(headers, dict) and headers.get("type"):
            return str(headers["type"])
        domain = metadata.get("domain")
        if isinstance(domain, dict) and domain.get("fqn"):
            return str(domain["fqn"])
        if metadata.get("type"):
            return str(metadata["type"])
    return str(message.get("type") or "")


def message_id(message: Any) -> str:
    """Return Protean's own id of a message (``metadata.headers.id``; '' when none)."""
    metadata = message.get("metadata") if isinstance(message, dict) else None
    headers = metadata.get("headers") if isinstance(metadata, dict) else None
    return str(headers.get("id") or "") if isinstance(headers, dict) else ""


def copy_key(group_queue: str, log_id: int | str) -> str:
    """Return the task index key of the copy of log entry ``log_id`` in ``group_queue``."""
    return index_key(FRAMEWORK, f"{group_queue}:{log_id}")


def _groups(queues: Sequence[str]) -> list[str]:
    """Return the group queues of ``queues``: one per registration (``<group>--at``) queue.

    A group's queue exists only while it holds a copy; its registration stays.
    """
    suffix = f"{SEP}at"
    return [queue.removesuffix(suffix) for queue in queues if queue.endswith(suffix)]


class ProteanFormat(TaskFormat):
    """Protean log entries and group copies."""

    framework: ClassVar[str] = FRAMEWORK

    def describe(self, body: str) -> TaskInfo | None:
        """Return the message of a log entry or group copy (None for another framework's)."""
        log_id = envelope_id(body)
        if log_id is not None:
            try:
                _, message = open_envelope(body)
            except ValueError:  # cut short: the identifier is enough
                return TaskInfo(FRAMEWORK, str(log_id), "")
            return TaskInfo(FRAMEWORK, str(log_id), message_type(message), _preview(message))
        entry = load_json(body) if body.startswith('{"') and '"metadata"' in body else None
        if not isinstance(entry, dict) or not isinstance(entry.get("metadata"), dict):
            return None
        # A log entry: its identifier is its own message ID (the caller has it).
        return TaskInfo(FRAMEWORK, None, message_type(entry), _preview(entry))

    def lookups(self, query: str, queues: Sequence[str]) -> Lookups:
        """Return where a message of identifier (or Protean id) ``query`` may be."""
        keys = [index_key(FRAMEWORK, query)]  # Protean's own id names the log entry
        if not query.isdigit() or len(query) > 19:
            return Lookups(keys=tuple(keys))
        groups = _groups(queues)
        logs = sorted({queue.split(SEP)[0] for queue in groups})
        keys += [copy_key(group, query) for group in groups]
        return Lookups(keys=tuple(keys), messages=tuple((log, int(query)) for log in logs))

    def related(self, queue: str, message_id: int, queues: Sequence[str]) -> Lookups:
        """Return the group copies of log entry ``message_id`` of log ``queue``."""
        mine = [group for group in _groups(queues) if group.split(SEP)[0] == queue]
        return Lookups(keys=tuple(copy_key(group, message_id) for group in mine))

    def consumers(self, queue: str, queues: Sequence[str]) -> Sequence[tuple[str, str]]:
        """Return each group of log ``queue`` and its ``--at`` queue (its copy position)."""
        mine = [group for group in _groups(queues) if group.split(SEP)[0] == queue]
        return [(group, f"{group}{SEP}at") for group in mine]

    def progress_of(self, body: str) -> int | None:
        """Return the log ID a group's position record says it has copied up to."""
        return position_of(body)

    def source_queue(self, dead_letter_queue: str) -> str | None:
        """Return the group queue of a group's dead-letter queue (``<group>--dead``)."""
        suffix = f"{SEP}dead"
        return (
            dead_letter_queue.removesuffix(suffix) if dead_letter_queue.endswith(suffix) else None
        )


def _preview(message: dict[str, Any]) -> str:
    data = message.get("data", message.get("payload"))
    return shorten(data) if data is not None else ""
