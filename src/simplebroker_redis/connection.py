"""Connection construction: the one place a target becomes redis-py clients.

:class:`Connections` turns a target URL, the backend options and
SimpleBroker's config (busy timeout, ``BROKER_BACKEND_PASSWORD``) into
redis-py clients: pooled command clients for the sync and asyncio runners,
and dedicated Pub/Sub clients for the activity listeners. Both runners and
every listener build their connections here, so a topology or a TLS or
authentication setting is handled once for all of them.

Clients never retry a command on their own (``Retry(NoBackoff(), 0)``): a
lost reply may hide a committed write; :mod:`.runner` decides what may be
repeated.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Mapping
from typing import Any, Final

import redis
import redis.asyncio as aioredis
from redis.backoff import NoBackoff
from redis.retry import Retry
from simplebroker import resolve_config

from .options import BackendOptions, normalize_target, redact_target, target_has_password

#: Seconds allowed to open a TCP/unix connection.
CONNECT_TIMEOUT: Final[float] = 5.0

#: Seconds a command may take before its socket read times out.
COMMAND_TIMEOUT: Final[float] = 60.0

_DEFAULT_BUSY_TIMEOUT_MS: Final[int] = 5000

#: Environment variable holding the password when the target URL has none.
PASSWORD_ENV: Final[str] = "BROKER_BACKEND_PASSWORD"

# No CLIENT SETINFO on connect: one round trip less per new connection, and a
# least-privilege ACL user need not be granted it (Redis 7.0 lacks it).
_NO_SETINFO: Final[dict[str, Any]] = (
    {"driver_info": None}
    if "driver_info" in inspect.signature(redis.connection.AbstractConnection.__init__).parameters
    else {"lib_name": None, "lib_version": None}
)


def config_settings(config: Mapping[str, Any] | None) -> tuple[float, str]:
    """Return (default pool timeout, password) from a SimpleBroker config.

    Without a config, the environment's ``BROKER_*`` settings apply. The
    password is the config's ``BACKEND_PASSWORD``, else
    ``$BROKER_BACKEND_PASSWORD`` (documented as the way to keep it out of
    files, whichever way the runner was built).
    """
    if config is None:
        config = resolve_config(env=os.environ)
    busy = config.get("BUSY_TIMEOUT", _DEFAULT_BUSY_TIMEOUT_MS)
    password = config.get("BACKEND_PASSWORD") or os.environ.get(PASSWORD_ENV, "")
    return float(busy) / 1000.0, str(password)


class Connections:
    """How to connect to one target: validated settings and client factories.

    Args:
        target: ``redis://``, ``rediss://`` or ``unix://`` URL (with db number).
        options: The backend options (pool size and timeout are used here).
        config: SimpleBroker config; the environment when omitted.

    """

    def __init__(
        self, target: str, options: BackendOptions, config: Mapping[str, Any] | None
    ) -> None:
        self.target = normalize_target(target)
        default_timeout, env_password = config_settings(config)
        self.max_connections = options.max_connections
        self.pool_timeout = (
            default_timeout if options.pool_timeout is None else options.pool_timeout
        )
        self._password = None if target_has_password(self.target) else (env_password or None)
        self.redacted = redact_target(self.target)

    def __repr__(self) -> str:
        return f"Connections({self.redacted!r})"

    @property
    def identity(self) -> tuple[str, str | None]:
        """Return what makes two targets the same server and credentials."""
        return (self.target, self._password)

    def client_kwargs(self, *, label: str = "simplebroker-redis") -> dict[str, Any]:
        """Return the redis-py connection options every client of this target uses."""
        kwargs: dict[str, Any] = {
            "decode_responses": True,
            "socket_connect_timeout": CONNECT_TIMEOUT,
            "socket_timeout": COMMAND_TIMEOUT,
            "retry": Retry(NoBackoff(), 0),
            "client_name": f"{label}:{os.getpid()}",
            **_NO_SETINFO,
        }
        if self._password is not None:
            kwargs["password"] = self._password
        return kwargs

    def _subscriber_kwargs(self) -> dict[str, Any]:
        # A subscribed connection idles between messages: no read timeout.
        # RESP2: redis-py reads a RESP3 PONG on a subscribed connection as a
        # garbled message, and the listeners rely on PING answers.
        kwargs = self.client_kwargs(label="simplebroker-redis-wake")
        kwargs.update(socket_timeout=None, socket_keepalive=True, protocol=2)
        return kwargs

    def _pool_kwargs(self) -> dict[str, Any]:
        return {
            "max_connections": self.max_connections,
            "timeout": self.pool_timeout,
            **self.client_kwargs(),
        }

    def client(self) -> redis.Redis:
        """Return a command client with a blocking pool (``pool_timeout`` to get a connection)."""
        pool = redis.BlockingConnectionPool.from_url(self.target, **self._pool_kwargs())
        return redis.Redis(connection_pool=pool)

    def async_client(self) -> aioredis.Redis:
        """Return an asyncio command client with a blocking pool (one per event loop)."""
        pool = aioredis.BlockingConnectionPool.from_url(self.target, **self._pool_kwargs())
        return aioredis.Redis(connection_pool=pool)

    def subscriber(self) -> redis.Redis:
        """Return a client for one dedicated Pub/Sub connection (never pooled commands)."""
        return redis.Redis.from_url(self.target, **self._subscriber_kwargs())

    def async_subscriber(self) -> aioredis.Redis:
        """Return an asyncio client for one dedicated Pub/Sub connection."""
        return aioredis.Redis.from_url(self.target, **self._subscriber_kwargs())
