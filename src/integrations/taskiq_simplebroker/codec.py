"""Lossless bytes <-> SimpleBroker text, readable for JSON.

Taskiq hands brokers ``bytes`` from any serializer; SimpleBroker bodies are
text (UTF-8, NUL allowed, no lone surrogates). Valid UTF-8 that does not
start with NUL is stored *unchanged*, so ``broker peek`` shows a JSON task
exactly as Taskiq serialized it. Everything else is marked by a leading NUL,
which no JSON document and almost no text starts with:

- NUL ``b:`` + base64, for bytes that are not valid UTF-8 (pickle, msgpack),
- NUL ``t:`` + text, for valid UTF-8 text that itself starts with NUL.

Decoding checks one character on the common path.
"""

from __future__ import annotations

import base64
import binascii
from typing import Final

#: Marks a body that is not stored verbatim.
MARK: Final[str] = "\x00"

#: Prefix of base64-encoded (non-UTF-8) payloads.
BINARY_PREFIX: Final[str] = "\x00b:"

#: Prefix of text payloads that start with NUL themselves.
ESCAPED_PREFIX: Final[str] = "\x00t:"


def encode_body(data: bytes) -> str:
    """Return SimpleBroker text that :func:`decode_body` turns back into ``data``."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return BINARY_PREFIX + base64.b64encode(data).decode("ascii")
    if text.startswith(MARK):
        return ESCAPED_PREFIX + text
    return text


def stored_size(data: bytes) -> int:
    """Return the size in bytes of what :func:`encode_body` stores for ``data`` (without it)."""
    escaped = len(ESCAPED_PREFIX) if data.startswith(b"\x00") else 0
    if data.isascii():
        return len(data) + escaped
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return len(BINARY_PREFIX) + 4 * ((len(data) + 2) // 3)
    return len(data) + escaped


def decode_body(text: str) -> bytes:
    """Return the bytes stored by :func:`encode_body`; plain text is taken as UTF-8."""
    if not text.startswith(MARK):
        return text.encode("utf-8")
    if text.startswith(BINARY_PREFIX):
        try:
            return base64.b64decode(text[len(BINARY_PREFIX) :], validate=True)
        except binascii.Error as exc:
            raise ValueError("damaged base64 body") from exc
    if text.startswith(ESCAPED_PREFIX):
        return text[len(ESCAPED_PREFIX) :].encode("utf-8")
    # Written by something else (for example `broker write`): take it as text.
    return text.encode("utf-8")
