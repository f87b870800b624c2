"""Connection construction: the one place a target becomes redis-py clients.

:class:`Connections` turns a target URL, the backend options and
SimpleBroker's config (busy timeout, ``BROKER_BACKEND_PASSWORD``) into
redis-py clients: pooled command clients for the sync and asyncio runners,
and dedicated Pub/Sub clients for the activity listeners. Both runners and
every listener build their connections here, so a topology or a TLS or
authentication setting is handled once for all of them.

Every topology ends in the same object above this module: a plain
``redis.Redis`` (or ``redis.asyncio.Redis``) whose connections reach the
*primary that holds the namespace*. A namespace lives in one hash slot
(``{namespace}``), so that is one server in every topology:

- a single server: the target itself;
- Sentinel: redis-py's ``SentinelConnectionPool`` (made blocking here), whose
  every new connection asks the sentinels for the current primary;
- Cluster: the primary that owns the namespace's slot, found with ``CLUSTER
  SLOTS`` from the seed nodes and moved by ``MOVED`` replies. redis-py's
  ``RedisCluster`` is not used: its pipeline re-sends commands whose reply
  was lost, it sends ``WAIT`` to a default node rather than on the write's
  connection, and its sharded Pub/Sub ignores the server's ``sunsubscribe``
  when a slot moves (docs/notes/topologies.md, 1.3, 1.4, 2). Pinning the
  namespace's node keeps FCALL, ``WAIT`` pipelines, ``SCAN`` and ``SSUBSCRIBE``
  identical on every topology.

Clients never retry a command on their own (``Retry(NoBackoff(), 0)``, the
asyncio ``Retry`` for asyncio clients): a lost reply may hide a committed
write; :mod:`.runner` decides what may be repeated (:class:`Route` and
:class:`AsyncRoute` carry its redirections).
"""

from __future__ import annotations

import asyncio
import inspect
import os
import socket
import threading
import weakref
from collections.abc import Callable, Mapping
from typing import Any, Final, Generic, TypeVar

import redis
import redis.asyncio as aioredis
import redis.asyncio.sentinel as aiosentinel
import redis.sentinel
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.retry import Retry

from . import tlsprobe
from .environment import environment_config
from .keys import Keyspace
from .options import BackendOptions
from .targets import TargetSpec, parse_target, redact_target

#: A data node's (host, port).
Address = tuple[str, int]

_Client = TypeVar("_Client")  #: a command client, sync or asyncio

#: Environment variable holding the sentinels' own password (``sentinel_password``).
SENTINEL_PASSWORD_ENV: Final[str] = "BROKER_BACKEND_SENTINEL_PASSWORD"

#: Seconds allowed to ask one seed node or sentinel about the topology.
DISCOVERY_TIMEOUT: Final[float] = 2.0

#: Seconds allowed to open a TCP/unix connection.
CONNECT_TIMEOUT: Final[float] = 5.0

#: Seconds a command may take before its socket read times out (the URL's
#: ``socket_timeout`` overrides it). No command of ours blocks on the server
#: (blocking reads wait on Pub/Sub, not on the command pool), so this bounds
#: how long a caller waits on a network that went silent: a write then fails
#: with ``OutcomeUnknown`` after this long. Twice the server's default
#: ``busy-reply-threshold`` (5 s): a script running longer than that makes
#: other clients' commands answer ``BUSY`` before they time out.
COMMAND_TIMEOUT: Final[float] = 10.0

#: TCP keepalive of every TCP connection: probes after this many idle
#: seconds, every ``KEEPALIVE_INTERVAL`` s, ``KEEPALIVE_COUNT`` unanswered
#: ones close the socket. A pooled connection that a NAT or a firewall
#: dropped while idle is then found dead by the pool's checkout, before a
#: command is written into it (which would leave that command's outcome
#: unknown). The operating system's default starts probing after 2 hours.
KEEPALIVE_IDLE: Final[int] = 10
KEEPALIVE_INTERVAL: Final[int] = 3
KEEPALIVE_COUNT: Final[int] = 3

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


def keepalive_options() -> dict[int, int]:
    """Return the bounded TCP keepalive settings this platform supports (see ``KEEPALIVE_*``)."""
    wanted = (
        ("TCP_KEEPIDLE", KEEPALIVE_IDLE),
        ("TCP_KEEPALIVE", KEEPALIVE_IDLE),  # macOS's name for the idle time
        ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL),
        ("TCP_KEEPCNT", KEEPALIVE_COUNT),
    )
    options: dict[int, int] = {}
    for name, value in wanted:
        option = getattr(socket, name, None)
        if isinstance(option, int):
            options[option] = value
    return options


def _no_retry(aio: bool) -> Retry | AsyncRetry:
    """Return redis-py's "never retry" policy for a sync or an asyncio client."""
    return AsyncRetry(NoBackoff(), 0) if aio else Retry(NoBackoff(), 0)


def config_settings(config: Mapping[str, Any] | None) -> tuple[float, str]:
    """Return (default pool timeout, password) from a SimpleBroker config.

    Without a config, the environment's ``BROKER_*`` settings apply. The
    password is the config's ``BACKEND_PASSWORD``, else
    ``$BROKER_BACKEND_PASSWORD`` (documented as the way to keep it out of
    files, whichever way the runner was built).
    """
    if config is None:
        config = environment_config()
    busy = config.get("BUSY_TIMEOUT", _DEFAULT_BUSY_TIMEOUT_MS)
    password = config.get("BACKEND_PASSWORD") or os.environ.get(PASSWORD_ENV, "")
    return float(busy) / 1000.0, str(password)


class SentinelBlockingConnectionPool(
    redis.sentinel.SentinelConnectionPool, redis.BlockingConnectionPool
):
    """redis-py's Sentinel pool with ``BlockingConnectionPool``'s size limit and wait.

    redis-py 8 has no such class; this composition was checked against it
    (docs/notes/topologies.md, 3): ``SentinelConnectionPool.__init__`` runs,
    then ``BlockingConnectionPool``'s through ``super()``.
    """


class AsyncSentinelBlockingConnectionPool(
    aiosentinel.SentinelConnectionPool, aioredis.BlockingConnectionPool
):
    """The asyncio twin of :class:`SentinelBlockingConnectionPool`."""


class Connections:
    """How to connect to one target: validated settings and client factories.

    Args:
        target: ``redis://``, ``rediss://`` or ``unix://`` URL (with db
            number), ``redis+cluster://`` seeds or ``redis+sentinel://``
            sentinels (see :mod:`.options`).
        options: The backend options (pool size and timeout, namespace,
            ``sentinel_password`` are used here).
        config: SimpleBroker config; the environment when omitted.

    """

    def __init__(
        self, target: str, options: BackendOptions, config: Mapping[str, Any] | None
    ) -> None:
        self.spec: TargetSpec = parse_target(target)
        self.target = self.spec.url
        self.kind = self.spec.kind
        default_timeout, env_password = config_settings(config)
        self.max_connections = options.max_connections
        self.pool_timeout = (
            default_timeout if options.pool_timeout is None else options.pool_timeout
        )
        self._password = None if self.spec.password is not None else (env_password or None)
        self._sentinel_password = options.sentinel_password or (
            os.environ.get(SENTINEL_PASSWORD_ENV) or None
        )
        self.redacted = redact_target(self.target)
        #: Seconds a command's reply may take (:data:`COMMAND_TIMEOUT`), plus
        #: what WAIT and WAITAOF may take after a write (``wait_timeout`` each).
        self.command_timeout = COMMAND_TIMEOUT + (
            2 * options.wait_timeout if options.durable else 0.0
        )
        #: Seconds allowed to open a connection (:data:`CONNECT_TIMEOUT`).
        self.connect_timeout = CONNECT_TIMEOUT
        #: The namespace's hash slot (cluster routing).
        self.slot = key_slot(Keyspace.for_namespace(options.namespace).meta.encode())
        self._owner: Address | None = None  #: cluster: the slot's primary, once known
        self._owner_lock = threading.Lock()
        self._sentinel: Any = None  #: redis.sentinel.Sentinel (unannotated), per process
        self._async_sentinels: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = (
            weakref.WeakKeyDictionary()
        )
        self._sentinel_pid = 0

    def __repr__(self) -> str:
        return f"Connections({self.redacted!r})"

    @property
    def identity(self) -> tuple[str, str | None]:
        """Return what makes two targets the same server and credentials."""
        return (self.target, self._password)

    @property
    def routed(self) -> bool:
        """Return whether the primary may move (Cluster, Sentinel): refusals are retried."""
        return self.kind != "single"

    def client_kwargs(
        self, *, label: str = "simplebroker-redis", aio: bool = False
    ) -> dict[str, Any]:
        """Return the redis-py connection options every client of this target uses.

        ``aio``: for an asyncio client, which takes redis-py's asyncio ``Retry``
        (redis-py 8 converts a sync one with a warning in every process).
        """
        kwargs: dict[str, Any] = {
            "decode_responses": True,
            "socket_connect_timeout": self.connect_timeout,
            "socket_timeout": self.command_timeout,
            "retry": _no_retry(aio),
            "client_name": f"{label}:{os.getpid()}",
            **_NO_SETINFO,
        }
        if self.spec.scheme != "unix":  # TCP options: unix sockets refuse them
            kwargs.update(socket_keepalive=True, socket_keepalive_options=keepalive_options())
        if self._password is not None:
            kwargs["password"] = self._password
        return kwargs

    def _subscriber_kwargs(self, aio: bool = False) -> dict[str, Any]:
        # A subscribed connection idles between messages: no read timeout
        # (the listeners check it with PINGs that must be answered in time,
        # see activity/outage.py). RESP2: redis-py reads a RESP3 PONG on a
        # subscribed connection as a garbled message, and the listeners rely
        # on PING answers.
        kwargs = self.client_kwargs(label="simplebroker-redis-wake", aio=aio)
        kwargs.update(socket_timeout=None, protocol=2)
        return kwargs

    def _pool_kwargs(self, aio: bool = False) -> dict[str, Any]:
        return {
            "max_connections": self.max_connections,
            "timeout": self.pool_timeout,
            **self.client_kwargs(aio=aio),
        }

    def _tls(self, *, aio: bool = False, sentinel: bool = False) -> dict[str, Any]:
        """Return the ``connection_class`` of a ``rediss://`` target's data connections.

        They are redis-py's TLS connections that tell a plain-text port apart
        from a server that is down (:mod:`.tlsprobe`); nothing for a plain target.
        """
        if self.spec.scheme != "rediss":
            return {}
        return {"connection_class": tlsprobe.connection_class(aio=aio, sentinel=sentinel)}

    # -- where the namespace lives ------------------------------------------------
    def _data_kwargs(
        self, kwargs: dict[str, Any], *, aio: bool = False, sentinel: bool = False
    ) -> dict[str, Any]:
        """Return ``kwargs`` plus the URL's credentials and TLS options, without an address."""
        parse_url: Any = redis.connection.parse_url  # redis-py leaves it unannotated
        parsed: dict[str, Any] = parse_url(self.spec.node_url("localhost", 1))
        for name in ("host", "port", "connection_class"):
            parsed.pop(name, None)
        return {**parsed, **kwargs, **self._tls(aio=aio, sentinel=sentinel)}

    def _sentinel_kwargs(self, aio: bool = False) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "socket_connect_timeout": DISCOVERY_TIMEOUT,
            "socket_timeout": DISCOVERY_TIMEOUT,
            "retry": _no_retry(aio),
            "decode_responses": True,
            **_NO_SETINFO,
        }
        if self._sentinel_password is not None:
            kwargs["password"] = self._sentinel_password
        return kwargs

    def sentinel(self) -> Any:
        """Return this process's ``Sentinel`` manager (sentinel targets only)."""
        if self._sentinel is None or self._sentinel_pid != os.getpid():
            factory: Any = redis.sentinel.Sentinel  # unannotated in redis-py
            self._sentinel = factory(list(self.spec.hosts), sentinel_kwargs=self._sentinel_kwargs())
            self._sentinel_pid = os.getpid()
        return self._sentinel

    def owner(self) -> Address:
        """Return the cluster primary that owns the namespace's slot (asks the seeds once)."""
        owner = self._owner
        return owner if owner is not None else self.find_owner()

    def moved(self, address: Address | None) -> None:
        """Record that the slot moved to ``address`` (None: ask the seeds next time)."""
        with self._owner_lock:
            self._owner = address

    def find_owner(self) -> Address:
        """Ask the seed nodes (and the last known owner) which primary serves the slot."""
        candidates = list(self.spec.hosts)
        if self._owner is not None:
            candidates.insert(0, self._owner)
        errors: list[str] = []
        failures: list[redis.RedisError] = []
        for host, port in dict.fromkeys(candidates):
            pool = redis.ConnectionPool(
                **self._data_kwargs(
                    {
                        "host": host,
                        "port": port,
                        "socket_connect_timeout": DISCOVERY_TIMEOUT,
                        "socket_timeout": DISCOVERY_TIMEOUT,
                        "retry": Retry(NoBackoff(), 0),
                        "protocol": 2,
                        "decode_responses": True,
                        **_NO_SETINFO,
                    }
                )
            )
            node: Any = redis.Redis.from_pool(pool)  # closing the client closes its pool
            try:
                ranges = node.execute_command("CLUSTER SLOTS")
            except redis.RedisError as exc:
                errors.append(f"{host}:{port}: {type(exc).__name__}: {exc}")
                failures.append(exc)
                continue
            finally:
                node.close()
            for first, last, primary, *_ in ranges:
                if int(first) <= self.slot <= int(last):
                    address = (str(primary[0]) or host, int(primary[1]))
                    self.moved(address)
                    return address
            errors.append(f"{host}:{port}: no node serves slot {self.slot}")
        # The last seed's error as the cause: errors.translate reads a TLS failure there.
        raise redis.ConnectionError(
            f"Error connecting to the cluster: no seed node named the primary of slot "
            f"{self.slot} ({'; '.join(errors)})"
        ) from (failures[-1] if failures else None)

    # -- clients ----------------------------------------------------------------
    def client(self, address: Address | None = None) -> redis.Redis:
        """Return a command client with a blocking pool (``pool_timeout`` to get a connection).

        Cluster: the pool reaches ``address`` (default: the slot's owner now).
        """
        if self.kind == "sentinel":
            sentinel_pool: Any = SentinelBlockingConnectionPool  # unannotated __init__
            pool = sentinel_pool(
                self.spec.service,
                self.sentinel(),
                **self._data_kwargs(self._pool_kwargs(), sentinel=True),
            )
        else:
            pool = redis.BlockingConnectionPool.from_url(
                self._url(address), **self._pool_kwargs(), **self._tls()
            )
        return redis.Redis(connection_pool=pool)

    def _url(self, address: Address | None) -> str:
        if self.kind != "cluster":
            return self.target
        host, port = address or self.owner()
        return self.spec.node_url(host, port)

    def async_client(self, address: Address | None = None) -> aioredis.Redis:
        """Return an asyncio command client with a blocking pool (one per event loop)."""
        if self.kind == "sentinel":
            sentinel_pool: Any = AsyncSentinelBlockingConnectionPool  # unannotated __init__
            pool = sentinel_pool(
                self.spec.service,
                self.async_sentinel(),
                **self._data_kwargs(self._pool_kwargs(aio=True), aio=True, sentinel=True),
            )
        else:
            pool = aioredis.BlockingConnectionPool.from_url(
                self._url(address), **self._pool_kwargs(aio=True), **self._tls(aio=True)
            )
        return aioredis.Redis(connection_pool=pool)

    def async_sentinel(self) -> Any:
        """Return the running loop's asyncio ``Sentinel`` manager (connections belong to a loop)."""
        loop = asyncio.get_running_loop()
        manager = self._async_sentinels.get(loop)
        if manager is None:
            factory: Any = aiosentinel.Sentinel  # unannotated in redis-py
            manager = factory(
                list(self.spec.hosts), sentinel_kwargs=self._sentinel_kwargs(aio=True)
            )
            self._async_sentinels[loop] = manager
        return manager

    def subscriber(self) -> redis.Redis:
        """Return a client for one dedicated Pub/Sub connection (never pooled commands).

        Cluster: on the slot's owner now; the caller reconnects through here
        when the slot moves.
        """
        if self.kind == "sentinel":
            kwargs = self._data_kwargs(self._subscriber_kwargs(), sentinel=True)
            manager: Any = self.sentinel()  # master_for is unannotated
            client: redis.Redis = manager.master_for(self.spec.service, **kwargs)
            return client
        return redis.Redis.from_url(self._url(None), **self._subscriber_kwargs(), **self._tls())

    def async_subscriber(self) -> aioredis.Redis:
        """Return an asyncio client for one dedicated Pub/Sub connection."""
        if self.kind == "sentinel":
            kwargs = self._data_kwargs(self._subscriber_kwargs(aio=True), aio=True, sentinel=True)
            aclient: aioredis.Redis = self.async_sentinel().master_for(self.spec.service, **kwargs)
            return aclient
        return aioredis.Redis.from_url(
            self._url(None), **self._subscriber_kwargs(aio=True), **self._tls(aio=True)
        )

    async def async_owner(self) -> Address:
        """Return the cluster slot's owner, asking the seeds off the event loop if unknown."""
        owner = self._owner
        return owner if owner is not None else await asyncio.to_thread(self.find_owner)


class _Nodes(Generic[_Client]):
    """A process's clients of one target, one per node, each created once.

    What :class:`Route` and :class:`AsyncRoute` share: the clients by node
    address (None: the single server, or Sentinel's primary) and MOVED
    re-pointing. ``make`` builds the client of an address.
    """

    def __init__(self, connections: Connections, make: Callable[[Address | None], _Client]) -> None:
        self._connections = connections
        self._make = make
        self._clients: dict[Address | None, _Client] = {}
        self._lock = threading.Lock()

    def node(self, address: Address | None) -> _Client:
        """Return the client of ``address`` (cluster), creating its pool once."""
        client = self._clients.get(address)
        if client is None:
            with self._lock:
                client = self._clients.get(address)
                if client is None:
                    client = self._clients[address] = self._make(address)
        return client

    def moved(self, address: Address | None) -> None:
        """Re-point the primary: to ``address`` (a MOVED reply), or ask again (None)."""
        if self._connections.kind == "cluster":
            self._connections.moved(address)

    def _forget(self) -> list[_Client]:
        """Return every client made so far, forgotten (the caller closes them)."""
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        return clients


class Route(_Nodes[redis.Redis]):
    """The command clients of one process for one target: the primary, and redirections.

    Single server and Sentinel: one pooled client (Sentinel's pool follows the
    primary by itself). Cluster: one pooled client per node, the slot's owner
    by default; :meth:`moved` re-points it.
    """

    def __init__(self, connections: Connections) -> None:
        super().__init__(connections, connections.client)

    def primary(self) -> redis.Redis:
        """Return the client of the namespace's primary now."""
        cluster = self._connections.kind == "cluster"
        return self.node(self._connections.owner() if cluster else None)

    def close(self) -> None:
        """Disconnect every pool."""
        for client in self._forget():
            client.connection_pool.disconnect()


class AsyncRoute(_Nodes[aioredis.Redis]):
    """The asyncio twin of :class:`Route` (one per event loop)."""

    def __init__(self, connections: Connections) -> None:
        super().__init__(connections, connections.async_client)

    async def primary(self) -> aioredis.Redis:
        """Return the client of the namespace's primary now."""
        if self._connections.kind == "cluster":
            return self.node(await self._connections.async_owner())
        return self.node(None)

    async def aclose(self) -> None:
        """Close every pool."""
        for client in self._forget():
            await client.aclose(close_connection_pool=True)
