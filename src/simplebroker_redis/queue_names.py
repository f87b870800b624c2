"""The task frameworks' queue names, mapped one-to-one onto SimpleBroker queue names.

SimpleBroker queue names take ``[A-Za-z0-9_.-]``, up to 512 characters, not
starting with ``-`` or ``.``; the frameworks' own brokers take more: Celery
names a worker's mailbox ``celery@host.celery.pidbox``, taskiq-redis users
write ``taskiq:queue``. :func:`storage_queue` is the one mapping every
integration stores such names under:

- a name SimpleBroker accepts, holding neither ``--`` nor a ``-`` followed by
  two upper-case hex digits, is kept as it is (``celery``, ``emails``,
  ``my-queue``), so ``broker peek celery`` shows the ``celery`` queue;
- any other name has each character outside ``[A-Za-z0-9_.]`` (and a
  leading ``.`` or ``_``) written as ``-HH`` per UTF-8 byte, upper-case hex
  (``taskiq:queue`` -> ``taskiq-3Aqueue``, ``celery@host`` ->
  ``celery-40host``, ``-x`` -> ``_-2Dx``: a leading ``_`` when it would
  start with ``-``);
- a name whose escaped form would pass 512 characters keeps its first 478
  and ends in ``--`` and 32 hex digits of its SHA-256.

Kept names hold no ``-HH`` and no ``--``; escaped ones at least one ``-HH``
and no ``--``; shortened ones ``--``: two names never share a queue (short of
a digest collision). :func:`shown_queue` turns a stored name back into the
framework's name for people (the dashboard); a name it cannot tell apart
(a shortened one, or a queue written by other means) is shown as stored.
"""

from __future__ import annotations

import functools
import hashlib
import re
from typing import Final

from .validation import validate_queue_name

#: Longest SimpleBroker queue name.
MAX_QUEUE: Final[int] = 512

#: Characters an escaped name keeps as they are (``-`` is escaped: it marks escapes).
_SAFE: Final[frozenset[str]] = frozenset(
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_."
)

#: A name SimpleBroker accepts.
_VALID: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\Z")

#: What only an escaped or shortened name holds: ``-HH`` or ``--``.
_ESCAPE_LIKE: Final = re.compile(r"-(?:[0-9A-F]{2}|-)")

#: An escaped name: safe characters and ``-HH`` escapes, maybe a leading ``_`` before one.
_ESCAPED: Final = re.compile(r"_?(?:[A-Za-z0-9_.]|-[0-9A-F]{2})+\Z")

#: Characters of a shortened name's digest.
_DIGEST: Final[int] = 32


@functools.lru_cache(maxsize=4096)  # called for every delivery: a few names, pure
def storage_queue(name: str) -> str:
    """Return the SimpleBroker queue that stores the framework's queue ``name`` (see above).

    Raises:
        QueueNameError: ``name`` is empty (or not a string).

    """
    if not isinstance(name, str) or not name:
        return validate_queue_name(name)  # SimpleBroker's error for an empty name
    if len(name) <= MAX_QUEUE and _VALID.match(name) and not _ESCAPE_LIKE.search(name):
        return name
    parts = []
    for index, char in enumerate(name):
        if char in _SAFE and not (index == 0 and char in "._"):
            parts.append(char)
        else:
            parts.extend(f"-{byte:02X}" for byte in char.encode("utf-8"))
    escaped = "".join(parts)
    if escaped.startswith("-"):
        escaped = "_" + escaped
    if len(escaped) > MAX_QUEUE:
        digest = hashlib.sha256(name.encode("utf-8")).hexdigest()[:_DIGEST]
        escaped = f"{escaped[: MAX_QUEUE - _DIGEST - 2]}--{digest}"
    return validate_queue_name(escaped)


def shown_queue(stored: str) -> str:
    """Return the framework's name of the SimpleBroker queue ``stored``, for people.

    The inverse of :func:`storage_queue` where there is one; otherwise
    ``stored`` itself (a kept or shortened name, a queue written by other
    means).
    """
    if "--" in stored or not _ESCAPE_LIKE.search(stored) or not _ESCAPED.match(stored):
        return stored
    body = stored[1:] if stored.startswith("_-") else stored
    raw = bytearray()
    at = 0
    while at < len(body):
        if body[at] == "-":
            raw.append(int(body[at + 1 : at + 3], 16))
            at += 3
        else:
            raw.append(ord(body[at]))
            at += 1
    try:
        name = raw.decode("utf-8")
    except UnicodeDecodeError:
        return stored
    return name if storage_queue(name) == stored else stored
