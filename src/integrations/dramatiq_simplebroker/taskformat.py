"""How the dashboard reads Dramatiq's stored messages and results (the ``dramatiq`` task format).

A message is Dramatiq's own encoding of it (JSON by default, through
:func:`simplebroker_redis.codec.encode_body`): ``queue_name`` and
``actor_name`` come first, then ``args``, ``kwargs``, ``options`` and
``message_id``, so a body cut short (the dashboard reads at most 16 KB)
still names its actor, and its message ID unless its arguments were long.
The broker indexes every message it writes under ``dramatiq:<message
id>`` (a retry of the ``Retries`` middleware, sent again under the same ID,
moves the entry to its new message).

A result lives under Dramatiq's message key (an MD5 of the result
namespace, queue, actor and message ID), which the message ID alone cannot
name: :mod:`.results` also stores, with the result and its expiry, the key
``dramatiq:result-of:<message id>`` holding that message key, and the
dashboard follows it (:meth:`DramatiqFormat.follow`). A failure is stored
as Dramatiq stores it (``{"__t": "dramatiq.results.Result", "exn": {"type",
"msg"}}``). A message nacked (the task failed for good) is in
``<queue>.XQ``; a retry from the dashboard puts it back in its queue.
Registered under the entry point group ``simplebroker_redis.task_formats``;
see :mod:`simplebroker_redis.tasks.formats`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, ClassVar, Final

from simplebroker_redis import queue_names
from simplebroker_redis.calls.dramatiq import result_key, result_of_key
from simplebroker_redis.codec import MARK, decode_body
from simplebroker_redis.keys import Keyspace
from simplebroker_redis.tasks import TaskFormat, TaskInfo, TaskOutcome
from simplebroker_redis.tasks.formats import field_text, load_json, shorten

from .config import DEAD_LETTER_SUFFIX

#: The framework's name in task index keys and on the dashboard.
FRAMEWORK: Final[str] = "dramatiq"

#: What marks a stored exception (``dramatiq.results.result``'s canary).
EXCEPTION_MARK: Final[str] = "dramatiq.results.Result"

#: Suffixes Dramatiq's own brokers give a queue's delay and dead-letter queues.
_QUEUE_SUFFIXES: Final[tuple[str, ...]] = (".DQ", DEAD_LETTER_SUFFIX)


class DramatiqFormat(TaskFormat):
    """Dramatiq messages (JSON-encoded) and the result backend's values."""

    framework: ClassVar[str] = FRAMEWORK

    def describe(self, body: str) -> TaskInfo | None:
        """Return the task of a Dramatiq message body (None for another framework's)."""
        text = _text(body)
        if text is None or '"actor_name"' not in text or '"queue_name"' not in text:
            return None
        message = load_json(text)
        if isinstance(message, dict):
            name = message.get("actor_name")
            if not isinstance(name, str) or not name or "message_id" not in message:
                return None
            args = {"args": message.get("args", []), "kwargs": message.get("kwargs", {})}
            return TaskInfo(
                FRAMEWORK,
                str(message.get("message_id") or "") or None,
                name,
                shorten(args),
                _origin(message.get("queue_name")),
            )
        if message is not None:
            return None
        # Cut short (long arguments): the leading fields still name it.
        name = field_text(text, "actor_name")
        if not name:
            return None
        origin = _origin(field_text(text, "queue_name"))
        return TaskInfo(FRAMEWORK, field_text(text, "message_id"), name, "", origin)

    def result_keys(self, keys: Keyspace, task_id: str) -> Sequence[str]:
        """Return the key naming the result of message ``task_id`` (:meth:`follow` reads on)."""
        return (result_of_key(keys, task_id),)

    def follow(self, keys: Keyspace, value: str) -> str | None:
        """Return the result key a ``result-of`` value names (Dramatiq's message key)."""
        return result_key(keys, value) if value else None

    def outcome(self, value: str) -> TaskOutcome | None:
        """Return the outcome of a stored result (a failure: Dramatiq's exception record)."""
        text = _text(value)
        if text is None:
            return None
        try:
            result = json.loads(text)
        except ValueError:
            # Cut short (a long value), or not JSON (another encoder's).
            if EXCEPTION_MARK in text[:200]:
                kind, message = field_text(text, "type"), field_text(text, "msg")
                return TaskOutcome("FAILURE", error=_error(kind, message))
            return TaskOutcome("SUCCESS", result=shorten(text))
        if isinstance(result, dict) and result.get("__t") == EXCEPTION_MARK:
            exn = result.get("exn")
            exn = exn if isinstance(exn, dict) else {}
            return TaskOutcome("FAILURE", error=_error(exn.get("type"), exn.get("msg")))
        return TaskOutcome("SUCCESS", result=shorten(result))

    def source_queue(self, dead_letter_queue: str) -> str | None:
        """Return the queue whose nacked messages ``dead_letter_queue`` (``<queue>.XQ``) holds."""
        shown = queue_names.shown_queue(dead_letter_queue)
        if not shown.endswith(DEAD_LETTER_SUFFIX) or len(shown) == len(DEAD_LETTER_SUFFIX):
            return None
        return _origin(shown)


def _origin(queue_name: Any) -> str | None:
    """Return the storage queue of a Dramatiq queue name (its priority 0 level)."""
    if not isinstance(queue_name, str) or not queue_name:
        return None
    for suffix in _QUEUE_SUFFIXES:
        if queue_name.endswith(suffix) and len(queue_name) > len(suffix):
            queue_name = queue_name[: -len(suffix)]
            break
    try:
        return queue_names.storage_queue(queue_name)
    except ValueError:
        return None


def _text(body: str) -> str | None:
    """Return a stored body as text (None: binary, another encoder's, never unpickled)."""
    if not body.startswith(MARK):
        return body
    try:
        return decode_body(body).decode("utf-8")
    except (ValueError, UnicodeDecodeError):
        return None


def _error(kind: Any, message: Any) -> str:
    """Return a stored exception as ``Type: message``."""
    return f"{kind or 'Exception'}: {message or ''}".strip().rstrip(":")
