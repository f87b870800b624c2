"""The wire path: a script's command sent on a pooled connection, past redis-py's wrapper.

Both runners send a script's FCALL (or EVALSHA) this way when nothing has to
follow it on the same connection (a WAIT, or a try redirected by ASK: those
go through a pipeline). :func:`direct` (sync) also keeps a few idle
connections out of its pool between calls (:class:`_Idle`);
:func:`direct_async` returns every connection, as the asyncio pool's
checkout is cheap.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from typing import Any, Final

import redis
import redis.asyncio as aioredis
import redis.exceptions as rx
import redis.sentinel

try:
    from hiredis import pack_command as _hiredis_pack
except ImportError:  # the optional hiredis extra
    _pack: Callable[[tuple[Any, ...]], bytes] | None = None
else:
    _pack = _hiredis_pack

#: Connections :func:`direct` keeps out of a pool between calls, at most: a
#: checkout from redis-py's pool (its lock and queue, metrics, a pid check)
#: and the release cost 15-18 us of CPU, half of what a loopback round trip
#: costs the client.
KEEP_IDLE: Final[int] = 4
#: A pool keeps at most one connection per this many it may open, so seven
#: in eight stay available to pipelines, plain commands and Pub/Sub (pools
#: of fewer than 8 keep none).
KEEP_IDLE_SHARE: Final[int] = 8


def send(connection: Any, command: tuple[Any, ...]) -> Any:
    """Send ``command`` on ``connection``: what its send returns (awaitable on asyncio).

    With hiredis the command is packed in one call, without the per-argument
    pass redis-py's hiredis packer ends in.
    """
    if _pack is None:
        return connection.send_command(*command)
    return connection.send_packed_command((_pack(command),))


class _Idle:
    """The connections of one pool that :func:`direct` keeps between its calls.

    They stay checked out of the pool, up to ``limit``. Taking one makes the
    check redis-py's checkout makes (unread data, or a socket the server
    closed: reconnect before sending, not after).
    """

    __slots__ = ("connections", "limit", "lock", "pool")

    def __init__(self, pool: Any, limit: int) -> None:
        self.pool = pool
        self.limit = limit
        self.connections: list[Any] = []
        self.lock = threading.Lock()

    def take(self) -> Any:
        with self.lock:
            connection = self.connections.pop() if self.connections else None
        if connection is None:
            return self.pool.get_connection()
        try:
            stale = connection.can_read()
        except (rx.ConnectionError, rx.TimeoutError, OSError):
            stale = True
        if stale:
            connection.disconnect()  # the send reconnects
        return connection

    def give(self, connection: Any) -> None:
        with self.lock:
            if len(self.connections) < self.limit:
                self.connections.append(connection)
                return
        self.pool.release(connection)


#: Attribute of a pool that holds its :class:`_Idle` (None: keeps none).
_IDLE_ATTRIBUTE: Final[str] = "_simplebroker_redis_idle"
_KEEPING: weakref.WeakSet[Any] = weakref.WeakSet()  #: pools with the attribute
_KEEPING_LOCK = threading.Lock()


def keep_limit(pool: Any) -> int:
    """Return how many idle connections :func:`direct` keeps out of ``pool``.

    0 for Sentinel pools (redis-py moves their idle connections to a new
    primary only while they sit in the pool) or pools whose connections the
    server may send maintenance notices (redis-py acts on them in its
    release).
    """
    size = getattr(pool, "max_connections", 0)
    if (
        not isinstance(size, int)
        or isinstance(pool, redis.sentinel.SentinelConnectionPool)
        or _maintenance_notified(pool)
    ):
        return 0
    return min(KEEP_IDLE, size // KEEP_IDLE_SHARE)


def _idle_of(pool: Any) -> _Idle | None:
    try:
        idle: _Idle | None = getattr(pool, _IDLE_ATTRIBUTE)
    except AttributeError:
        pass
    else:
        return idle
    limit = keep_limit(pool)
    with _KEEPING_LOCK:
        if not hasattr(pool, _IDLE_ATTRIBUTE):
            setattr(pool, _IDLE_ATTRIBUTE, _Idle(pool, limit) if limit > 0 else None)
            _KEEPING.add(pool)
        idle = getattr(pool, _IDLE_ATTRIBUTE)
    return idle


def _maintenance_notified(pool: Any) -> bool:
    """Whether the server may send ``pool``'s connections maintenance notices.

    Only over RESP3 (push messages); redis-py then reconnects a connection
    the notice marks in its release, which kept connections skip. The
    runners speak RESP2.
    """
    enabled = getattr(pool, "maint_notifications_enabled", None)
    resp3 = getattr(pool, "connection_kwargs", {}).get("protocol") in (3, "3")
    return resp3 and (bool(enabled()) if callable(enabled) else False)


def _forget_idle() -> None:
    # A forked child never uses its parent's sockets; redis-py resets the
    # pools themselves on their next use in the child.
    for pool in list(_KEEPING):
        if hasattr(pool, _IDLE_ATTRIBUTE):
            delattr(pool, _IDLE_ATTRIBUTE)
    _KEEPING.clear()


os.register_at_fork(after_in_child=_forget_idle)


def direct(client: redis.Redis, command: tuple[Any, ...]) -> Any:
    """Send one command on a pooled connection of ``client``; return its raw reply.

    What ``client.execute_command`` does for a command without a reply
    callback (FCALL, EVALSHA) and without retries (the clients have none),
    minus redis-py's per-command bookkeeping (observability, retry
    wrappers): a fifth of a write's client time. The connection comes from
    the pool's idle connections (:class:`_Idle`) when it keeps some. It
    disconnects itself on a transport error (and is then released to the
    pool); an error reply leaves it clean.
    """
    pool = client.connection_pool
    idle = _idle_of(pool)
    connection: Any = pool.get_connection() if idle is None else idle.take()
    try:
        send(connection, command)
        reply = connection.read_response()
    except BaseException:
        pool.release(connection)
        raise
    if idle is None:
        pool.release(connection)
    else:
        idle.give(connection)
    return reply


async def direct_async(client: aioredis.Redis, command: tuple[Any, ...]) -> Any:
    """Send one command on a pooled connection of ``client``; return its raw reply.

    The asyncio twin of :func:`direct`, keeping no idle connections. The
    connection disconnects itself when a send or read fails or is cancelled
    (a reply left unread never returns to the pool); an error reply leaves
    it clean.
    """
    pool: Any = client.connection_pool  # redis-py's asyncio pool is partly untyped
    connection: Any = await pool.get_connection()
    try:
        await send(connection, command)
        return await connection.read_response()
    finally:
        await pool.release(connection)
