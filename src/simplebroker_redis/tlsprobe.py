"""A ``rediss://`` URL that names a plain-text port: told apart from a server that is down.

A TLS client that connects to a plain-text Valkey/Redis port sends its
ClientHello, which the server reads as the start of an inline command and
waits for the rest of: the handshake times out after the connect timeout,
as it would for a server that hangs. So every TLS connection of a runner is
one of the classes here (``connection_class`` of each pool and client that
:mod:`.connection` makes for a ``rediss://`` target, sync and asyncio,
Sentinel-managed or not). When its connect fails in a way a handshake with
a plain-text port fails (a timeout, a TLS error, a connection cut), it asks
its own ``host:port`` once, in plain text, with one ``PING``: a port that
answers ``+PONG`` (or ``-NOAUTH``, or any error reply) is certainly not a
TLS port, and the connect raises :class:`TLSMismatch`, which
:func:`~simplebroker_redis.errors.translate` reports as ``AccessDenied``
(never retried). Any other outcome (no answer, a TLS alert, a closed
connection) leaves the failure as it was.

The probe costs at most :data:`PROBE_TIMEOUT`, only after a connect that
already failed; a connection refused or a name that does not resolve is not
probed.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from typing import Any, Final

import redis
import redis.asyncio
import redis.asyncio.sentinel
import redis.exceptions as rx
import redis.sentinel

#: Seconds the plain-text probe may take (it runs only after a failed connect).
PROBE_TIMEOUT: Final[float] = 0.5

#: How a handshake with a plain-text port ends: it times out (the server waits
#: for the rest of a command), it reads a reply that is not TLS, or the server
#: cuts the connection. A connect that never reached the port (refused,
#: unresolvable, unreachable) ends otherwise and is not probed.
_HANDSHAKE_FAILURES: Final = (
    ssl.SSLError,
    TimeoutError,  # also socket.timeout and asyncio.TimeoutError
    rx.TimeoutError,
    ConnectionResetError,
    ConnectionAbortedError,
    BrokenPipeError,
)


class TLSMismatch(rx.ConnectionError):
    """A TLS connection's port answers in plain text: ``address`` (``host:port``) names it.

    ``failure`` is what the connect itself raised (a handshake timeout, say).
    """

    def __init__(self, address: str, failure: BaseException) -> None:
        super().__init__(f"TLS mismatch: {address} answers in plain text, not TLS")
        self.address = address
        self.failure = failure


def _chain(exc: BaseException) -> list[BaseException]:
    """Return ``exc`` and its causes and contexts, each once."""
    seen: list[BaseException] = []
    cause: BaseException | None = exc
    while cause is not None and all(cause is not other for other in seen):
        seen.append(cause)
        cause = cause.__cause__ or cause.__context__
    return seen


def found_mismatch(exc: BaseException) -> TLSMismatch | None:
    """Return the :class:`TLSMismatch` among ``exc`` and its causes, if any."""
    return next((error for error in _chain(exc) if isinstance(error, TLSMismatch)), None)


def _worth_probing(exc: BaseException) -> bool:
    return any(isinstance(error, _HANDSHAKE_FAILURES) for error in _chain(exc))


def _address(connection: Any) -> tuple[str, int] | None:
    host, port = getattr(connection, "host", None), getattr(connection, "port", None)
    return None if not host or not port else (str(host), int(port))


def answers_plain_text(host: str, port: int) -> bool:
    """Return whether ``host:port`` answers a plain-text ``PING`` with a RESP reply."""
    try:
        with socket.create_connection((host, port), timeout=PROBE_TIMEOUT) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(1) in (b"+", b"-")
    except OSError:
        return False


async def answers_plain_text_async(host: str, port: int) -> bool:
    """:func:`answers_plain_text` on the event loop (it never blocks the loop)."""
    try:
        async with asyncio.timeout(PROBE_TIMEOUT):
            reader, writer = await asyncio.open_connection(host, port)
            try:
                writer.write(b"PING\r\n")
                await writer.drain()
                first = await reader.read(1)
            finally:
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
    except OSError:  # TimeoutError too
        return False
    return first in (b"+", b"-")


class _Probing:
    """Mixin of a sync TLS connection: a failed connect asks its port in plain text."""

    def connect_check_health(self, *args: Any, **kwargs: Any) -> Any:
        """Connect as redis-py does; a plain-text port behind a failure: :class:`TLSMismatch`."""
        try:
            return super().connect_check_health(*args, **kwargs)  # type: ignore[misc]
        except (rx.ConnectionError, rx.TimeoutError) as exc:
            address = _address(self)
            if address is None or not _worth_probing(exc) or not answers_plain_text(*address):
                raise
            raise TLSMismatch(f"{address[0]}:{address[1]}", exc) from exc


class _AsyncProbing:
    """Mixin of an asyncio TLS connection: a failed connect asks its port in plain text."""

    async def connect_check_health(self, *args: Any, **kwargs: Any) -> Any:
        """Connect as redis-py does; a plain-text port behind a failure: :class:`TLSMismatch`."""
        try:
            return await super().connect_check_health(*args, **kwargs)  # type: ignore[misc]
        except (rx.ConnectionError, rx.TimeoutError) as exc:
            address = _address(self)
            if (
                address is None
                or not _worth_probing(exc)
                or not await answers_plain_text_async(*address)
            ):
                raise
            raise TLSMismatch(f"{address[0]}:{address[1]}", exc) from exc


class ProbingSSLConnection(_Probing, redis.SSLConnection):
    """redis-py's TLS connection that names a plain-text port (see the module docstring)."""


class ProbingSentinelSSLConnection(_Probing, redis.sentinel.SentinelManagedSSLConnection):
    """The same, for a Sentinel-managed primary."""


class AsyncProbingSSLConnection(_AsyncProbing, redis.asyncio.SSLConnection):
    """redis-py's asyncio TLS connection that names a plain-text port."""


class AsyncProbingSentinelSSLConnection(
    _AsyncProbing, redis.asyncio.sentinel.SentinelManagedSSLConnection
):
    """The same, for an asyncio Sentinel-managed primary."""


def connection_class(*, aio: bool, sentinel: bool) -> type[Any]:
    """Return the TLS connection class of a pool: asyncio or not, Sentinel-managed or not."""
    if aio:
        return AsyncProbingSentinelSSLConnection if sentinel else AsyncProbingSSLConnection
    return ProbingSentinelSSLConnection if sentinel else ProbingSSLConnection
