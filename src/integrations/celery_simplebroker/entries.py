"""How the result backend's entries look in Redis, and which channel announces a result.

Values are stored as text so that ``redis-cli`` shows readable JSON; the
bytes of other serializers are kept losslessly as marked base64. Each
task's result has a pseudo queue whose SimpleBroker wake-up channel the
script storing the result publishes on (``celery_store.lua``), and that
waiters (:mod:`.consumer`) subscribe to.
"""

from __future__ import annotations

import base64
import hashlib

from simplebroker_redis.validation import validate_queue_name

_BINARY = "\x00b:"  # marks a base64 value (a serializer's non-UTF-8 bytes)
_ESCAPED = "\x00t:"  # marks text that starts with NUL itself


def encode_value(value: str | bytes) -> str:
    """Return text for Redis: text verbatim (readable JSON), bytes as marked base64."""
    if isinstance(value, bytes):
        return _BINARY + base64.b64encode(value).decode("ascii")
    return _ESCAPED + value if value.startswith("\x00") else value


def decode_value(text: str | bytes | None) -> str | bytes | None:
    """Return what :func:`encode_value` was given."""
    if text is None or isinstance(text, bytes) or not text.startswith("\x00"):
        return text
    if text.startswith(_BINARY):
        return base64.b64decode(text[len(_BINARY) :])
    return text[len(_ESCAPED) :] if text.startswith(_ESCAPED) else text


def wake_name(task_id: str) -> str:
    """Return the pseudo queue whose wake-up channel announces ``task_id``'s result."""
    name = f"celery-result.{task_id}"
    try:
        return validate_queue_name(name)
    except ValueError:
        return "celery-result.x" + hashlib.sha256(task_id.encode("utf-8")).hexdigest()[:40]
