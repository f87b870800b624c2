"""A ``rediss://`` URL that names a plain-text port: told apart from a server that is down.

A TLS client that connects to a plain-text Valkey/Redis port sends its
ClientHello, which the server reads as the start of an inline command and
waits for the rest of: the handshake times out after the connect timeout,
as it would for a server that hangs. After a handshake that timed out (or
failed on a reply that is not TLS), :func:`plain_text_port` asks the port
itself, in plain text, with one ``PING``: a Valkey/Redis port that answers
``+PONG`` (or ``-NOAUTH``, or any error reply) is certainly not a TLS port,
so the mismatch is named at once and never retried; any other outcome
(no answer, a TLS alert, a closed connection) leaves the failure as it was.
"""

from __future__ import annotations

import socket
import ssl
import traceback
from typing import Final

import redis
import redis.asyncio

#: Seconds the plain-text probe may take (it runs only after a failed handshake).
PROBE_TIMEOUT: Final[float] = 0.5

#: Frames in which a TLS handshake waits for the server: redis-py's sync
#: connection (``ssl``), and asyncio's (the transport is made after the handshake).
_HANDSHAKE_FRAMES: Final[frozenset[str]] = frozenset(
    {"do_handshake", "_create_connection_transport"}
)

_TLS_CONNECTIONS: Final = (redis.SSLConnection, redis.asyncio.SSLConnection)


def _chain(exc: BaseException) -> list[BaseException]:
    """Return ``exc`` and its causes and contexts, each once."""
    seen: list[BaseException] = []
    cause: BaseException | None = exc
    while cause is not None and all(cause is not other for other in seen):
        seen.append(cause)
        cause = cause.__cause__ or cause.__context__
    return seen


def _handshake_failure(exc: BaseException) -> tuple[str, int] | None:
    """Return (host, port) of the TLS connection whose handshake raised ``exc``, else None.

    The connection is found in the traceback: redis-py raises its own
    ``TimeoutError`` or ``ConnectionError`` from inside the connection's
    ``connect``, whose ``self`` is the connection.
    """
    address: tuple[str, int] | None = None
    in_handshake = False
    for error in _chain(exc):
        in_handshake = in_handshake or isinstance(error, ssl.SSLError)
        for frame, _ in traceback.walk_tb(error.__traceback__):
            in_handshake = in_handshake or frame.f_code.co_name in _HANDSHAKE_FRAMES
            owner = frame.f_locals.get("self")
            if address is None and isinstance(owner, _TLS_CONNECTIONS):
                address = (str(owner.host), int(owner.port))
    return address if in_handshake else None


def _answers_plain_text(host: str, port: int) -> bool:
    """Return whether ``host:port`` answers a plain-text ``PING`` with a RESP reply."""
    try:
        with socket.create_connection((host, port), timeout=PROBE_TIMEOUT) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(1) in (b"+", b"-")
    except OSError:
        return False


def plain_text_port(exc: BaseException) -> str | None:
    """Return ``host:port`` when ``exc`` is a TLS handshake with a port that speaks plain text.

    Blocks up to :data:`PROBE_TIMEOUT` (also on an event loop: it runs once,
    after a handshake that already waited for the connect timeout).
    """
    address = _handshake_failure(exc)
    if address is None or not _answers_plain_text(*address):
        return None
    return f"{address[0]}:{address[1]}"
