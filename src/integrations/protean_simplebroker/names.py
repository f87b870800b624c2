"""How Protean streams and consumer groups map onto SimpleBroker queue names.

SimpleBroker queue names take only ``[A-Za-z0-9_.-]``; Protean stream names
hold colons (``orders:dlq``, ``shop::order``) and group names are dotted
handler paths. Each name is therefore *encoded* into one component: letters,
digits, ``_`` and ``.`` stay as they are, every other byte of its UTF-8 form
becomes ``-`` and two lowercase hex digits (``orders:dlq`` ->
``orders-3adlq``). An encoded component never holds ``--``, so ``--``
separates components unambiguously:

========================================  =======================================
``<prefix>.<stream>``                     the stream's log: every published message
``<prefix>.<stream>--<group>``            the group's copies not yet acknowledged
``<prefix>.<stream>--<group>--at``        the group's registration and position
``<prefix>.<stream>--<group>--dead``      the group's dead letters (max deliveries)
``<prefix>.<stream>--<group>--failed``    SQLite only: one record per failed delivery
``<prefix>.<stream>--<group>--held.<c>``  SQLite only: copies consumer ``c`` holds
========================================  =======================================

:class:`Layout` builds these names; :func:`parse` reads one back.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Final, Literal

#: Separator between the encoded components of a queue name.
SEP: Final[str] = "--"

#: Characters a component keeps unescaped.
_PLAIN: Final = re.compile(r"[A-Za-z0-9_.]")

#: What an encoded component looks like.
_ENCODED: Final = re.compile(r"(?:[A-Za-z0-9_.]|-[0-9a-f]{2})+")

#: Queue-name prefixes must be a valid queue name start and hold no separator.
_PREFIX: Final = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.]*$")

#: Consumer tokens in SQLite held-queue names.
_TOKEN: Final = re.compile(r"^[a-z0-9]+$")

Kind = Literal["log", "group", "at", "dead", "failed", "held"]

#: Suffix components of the per-group queues (the held queue adds a token).
_SUFFIXES: Final[dict[str, Kind]] = {"at": "at", "dead": "dead", "failed": "failed"}


@lru_cache(maxsize=4096)
def encode(name: str) -> str:
    """Return ``name`` as one queue-name component (reversible, see the module doc)."""
    if not isinstance(name, str) or not name:
        raise ValueError("stream and group names must be non-empty strings")
    out: list[str] = []
    for char in name:
        if _PLAIN.fullmatch(char):
            out.append(char)
        else:
            out.extend(f"-{byte:02x}" for byte in char.encode("utf-8"))
    return "".join(out)


def decode(component: str) -> str:
    """Return the name :func:`encode` turned into ``component``.

    Raises:
        ValueError: ``component`` is not what :func:`encode` returns for any name.

    """
    if not _ENCODED.fullmatch(component):
        raise ValueError(f"not an encoded name: {component!r}")
    raw = bytearray()
    at = 0
    while at < len(component):
        if component[at] == "-":
            raw.append(int(component[at + 1 : at + 3], 16))
            at += 3
        else:
            raw.append(ord(component[at]))
            at += 1
    name = raw.decode("utf-8")
    if encode(name) != component:  # e.g. an escaped letter: not canonical
        raise ValueError(f"not an encoded name: {component!r}")
    return name


def validate_prefix(prefix: str) -> str:
    """Return ``prefix`` if it can start every queue name of this provider."""
    if not isinstance(prefix, str) or not _PREFIX.fullmatch(prefix):
        raise ValueError(
            f"QUEUE_PREFIX {prefix!r} must be letters, digits, '_' and '.', not starting with '.'"
        )
    return prefix


@dataclass(frozen=True, slots=True)
class Parsed:
    """A queue name of this provider, read back."""

    kind: Kind
    stream: str
    group: str | None = None
    token: str | None = None  #: the consumer of a held queue


@dataclass(frozen=True, slots=True)
class Layout:
    """The queue names of one provider instance (one prefix)."""

    prefix: str

    def _base(self, stream: str) -> str:
        return f"{self.prefix}.{encode(stream)}"

    def log(self, stream: str) -> str:
        """Return the queue holding every message published to ``stream``."""
        return self._base(stream)

    def group(self, stream: str, group: str) -> str:
        """Return the queue of ``group``'s copies of ``stream`` messages."""
        return f"{self._base(stream)}{SEP}{encode(group)}"

    def at(self, stream: str, group: str) -> str:
        """Return the queue holding ``group``'s registration and position."""
        return f"{self.group(stream, group)}{SEP}at"

    def dead(self, stream: str, group: str) -> str:
        """Return ``group``'s dead-letter queue (messages past max deliveries)."""
        return f"{self.group(stream, group)}{SEP}dead"

    def failed(self, stream: str, group: str) -> str:
        """Return the queue of ``group``'s failed-delivery records (SQLite)."""
        return f"{self.group(stream, group)}{SEP}failed"

    def held(self, stream: str, group: str, token: str) -> str:
        """Return the queue of copies consumer ``token`` holds (SQLite)."""
        if not _TOKEN.fullmatch(token):
            raise ValueError(f"not a consumer token: {token!r}")
        return f"{self.held_prefix(stream, group)}{token}"

    def held_prefix(self, stream: str, group: str) -> str:
        """Return the common start of ``group``'s held queues."""
        return f"{self.group(stream, group)}{SEP}held."

    @property
    def all_prefix(self) -> str:
        """Return the start every queue name of this layout shares."""
        return f"{self.prefix}."

    def parse(self, queue: str) -> Parsed | None:
        """Return what ``queue`` is, or None when it is not one of this layout's."""
        if not queue.startswith(self.all_prefix):
            return None
        parts = queue[len(self.all_prefix) :].split(SEP)
        try:
            names = [decode(part) for part in parts[:2]]
        except ValueError:  # UnicodeDecodeError is one
            return None
        if len(parts) == 1:
            return Parsed("log", names[0])
        if len(parts) == 2:
            return Parsed("group", names[0], names[1])
        if len(parts) != 3:
            return None
        kind = _SUFFIXES.get(parts[2])
        if kind is not None:
            return Parsed(kind, names[0], names[1])
        if parts[2].startswith("held.") and _TOKEN.fullmatch(parts[2][5:]):
            return Parsed("held", names[0], names[1], parts[2][5:])
        return None
