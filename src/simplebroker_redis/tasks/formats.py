"""The per-framework hook: how each integration's stored tasks are read.

Each framework stores a task as a message body of its own shape (Taskiq's
serialized ``BrokerMessage``, a kombu envelope, a Protean message) and its
outcome in a key of its own (Taskiq's result, Celery's task meta). The
dashboard and the exporter know none of them: each integration registers a
:class:`TaskFormat` under the entry point group ``simplebroker_redis.task_formats``
(``pyproject.toml``), and :func:`task_formats` loads the ones installed. A
new integration (Dramatiq, say) adds one class and one entry point line.

The hook is small: :meth:`TaskFormat.describe` reads a body
(framework, task id, task name, a preview of its arguments);
:meth:`TaskFormat.result_keys` and :meth:`TaskFormat.outcome` read a
finished task's stored outcome (:meth:`TaskFormat.follow` when the id
only names where it is); :meth:`TaskFormat.lookups` says where to
look for an id a user typed (by default the task index key
``"<framework>:<id>"``, which the integration's producer gives every
message it writes: :func:`index_key`).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib.metadata import entry_points
from typing import Any, ClassVar, Final

from ..keys import Keyspace

logger = logging.getLogger("simplebroker_redis.tasks")

#: The entry point group integrations register their format under.
ENTRY_POINT_GROUP: Final[str] = "simplebroker_redis.task_formats"

#: Longest argument preview kept (characters).
PREVIEW_CHARS: Final[int] = 300


def index_key(framework: str, task_id: str) -> str:
    """Return the task index key of ``task_id`` (what a producer passes with the write)."""
    return f"{framework}:{task_id}"


@dataclass(frozen=True, slots=True)
class TaskInfo:
    """What a stored body says about its task."""

    framework: str
    task_id: str | None  #: None when the body does not carry it (the message ID names it)
    name: str  #: the task name ('' unknown)
    preview: str = ""  #: its arguments, shortened
    origin: str | None = None  #: the queue it was sent to, when the body names it


@dataclass(frozen=True, slots=True)
class TaskOutcome:
    """A finished task's stored outcome."""

    state: str  #: SUCCESS, FAILURE, ... (the framework's word, upper case)
    result: str = ""  #: its value, shortened
    error: str = ""  #: the error, one line
    traceback: str = ""


@dataclass(frozen=True, slots=True)
class Lookups:
    """Where to look for a task: task index keys, and (queue, message id) pairs."""

    keys: tuple[str, ...] = ()
    messages: tuple[tuple[str, int], ...] = field(default_factory=tuple)


class TaskFormat:
    """One framework's stored tasks (subclass it; see the module docstring)."""

    framework: ClassVar[str] = ""

    def describe(self, body: str) -> TaskInfo | None:
        """Return the task ``body`` carries, or None when it is not this framework's."""
        raise NotImplementedError

    def result_keys(self, keys: Keyspace, task_id: str) -> Sequence[str]:
        """Return the keys a finished task's outcome may be stored under (none by default)."""
        return ()

    def outcome(self, value: str) -> TaskOutcome | None:
        """Return the outcome stored as ``value`` (one of :meth:`result_keys`), if readable."""
        return None

    def follow(self, keys: Keyspace, value: str) -> str | None:
        """Return the key whose value is the outcome, when ``value`` (of a result key) names one.

        None by default: a result key holds the outcome. A framework whose
        results are keyed by more than the task id (Dramatiq's message key)
        stores beside each result a key named by the task id whose value
        names the result's key; the dashboard reads that key next (one more
        round trip), and gives its value to :meth:`outcome`.
        """
        return None

    def lookups(self, query: str, queues: Sequence[str]) -> Lookups:
        """Return where to look for the task a user named ``query`` (``queues``: every queue)."""
        return Lookups(keys=(index_key(self.framework, query),))

    def related(self, queue: str, message_id: int, queues: Sequence[str]) -> Lookups:
        """Return where else the task of message ``message_id`` of ``queue`` has messages.

        None by default; Protean's log entries have a copy in each consumer group.
        """
        return Lookups()

    def source_queue(self, dead_letter_queue: str) -> str | None:
        """Return the queue the dead letters of ``dead_letter_queue`` came from, if known."""
        return None

    def consumers(self, queue: str, queues: Sequence[str]) -> Sequence[tuple[str, str]]:
        """Return who consumes copies of ``queue``'s messages, and where their progress is.

        Pairs of (consumer queue, queue whose newest messages say how far it
        got: :meth:`progress_of`). None by default; Protean's consumer groups
        copy their stream's log.
        """
        return ()

    def progress_of(self, body: str) -> int | None:
        """Return the message ID a progress record says was reached (see :meth:`consumers`)."""
        return None


@cache
def task_formats() -> tuple[TaskFormat, ...]:
    """Return the formats of the integrations installed (one that fails to load is skipped)."""
    found: list[TaskFormat] = []
    for point in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda p: p.name):
        try:
            loaded = point.load()
            instance = loaded() if isinstance(loaded, type) else loaded
        except Exception as exc:  # noqa: BLE001 - a framework not installed: its tasks show raw
            logger.debug("task format %s not loaded: %s", point.name, exc)
            continue
        if isinstance(instance, TaskFormat):
            found.append(instance)
    return tuple(found)


def describe(body: str, formats: Sequence[TaskFormat] | None = None) -> TaskInfo | None:
    """Return what the first format that recognizes ``body`` says about it."""
    for fmt in task_formats() if formats is None else formats:
        try:
            info = fmt.describe(body)
        except Exception as exc:  # noqa: BLE001 - a body another program wrote
            logger.debug("%s could not read a body: %s", fmt.framework, exc)
            continue
        if info is not None:
            return info
    return None


# -- helpers the formats share ------------------------------------------------------------
def load_json(text: str) -> Any:
    """Return ``text`` parsed as JSON, or None (a body cut short, or not JSON)."""
    try:
        return json.loads(text)
    except ValueError:
        return None


def field_text(text: str, name: str) -> str | None:
    """Return the first JSON string field ``name`` in ``text`` (even a body cut short)."""
    found = re.search(r'"' + re.escape(name) + r'"\s*:\s*"((?:[^"\\]|\\.)*)"', text)
    if found is None:
        return None
    value = load_json('"' + found.group(1) + '"')
    return value if isinstance(value, str) else found.group(1)


def shorten(value: object, limit: int = PREVIEW_CHARS) -> str:
    """Return ``value`` as text of at most ``limit`` characters."""
    text = value if isinstance(value, str) else json.dumps(value, default=repr)
    return text if len(text) <= limit else text[: limit - 1] + "…"
