"""``RedisRunner``: one connection pool, its scripts, and fork safety.

A runner owns a redis-py ``BlockingConnectionPool`` for ordinary commands.
It opens nothing until first use, and a forked child builds its own pool the
first time it touches the runner (it never reuses its parent's sockets).
Pub/Sub never uses this pool: see :mod:`simplebroker_redis.activity`.

Commands are never retried automatically: a lost response may hide a
committed write. Read-only scripts may opt into one retry (``idempotent``).
"""

from __future__ import annotations

import atexit
import inspect
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, TypeVar, cast

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from simplebroker import resolve_config
from simplebroker.ext import BackendPlugin as _BackendPlugin
from simplebroker.ext import MaintenanceSchedule, OperationalError

from .errors import NamespaceMissing, translate
from .ids import HighWaterClock
from .keys import DEFAULT_NAMESPACE, Keyspace
from .options import (
    BackendOptions,
    normalize_target,
    redact_target,
    target_has_password,
)
from .scripts import ScriptName, Scripts

T = TypeVar("T")

#: Seconds allowed to open a TCP/unix connection.
CONNECT_TIMEOUT: Final[float] = 5.0

#: Seconds a command may take before its socket read times out.
COMMAND_TIMEOUT: Final[float] = 60.0

_DEFAULT_BUSY_TIMEOUT_MS: Final[int] = 5000

# No CLIENT SETINFO on connect: one round trip less per new connection, and a
# least-privilege ACL user need not be granted it (Redis 7.0 lacks it).
_NO_SETINFO: Final[dict[str, Any]] = (
    {"driver_info": None}
    if "driver_info" in inspect.signature(redis.connection.AbstractConnection.__init__).parameters
    else {"lib_name": None, "lib_version": None}
)


def _resolve_settings(
    config: Mapping[str, Any] | None,
) -> tuple[float, str]:
    """Return (default pool timeout, env password) from a SimpleBroker config."""
    if config is None:
        config = resolve_config()
    busy = config.get("BUSY_TIMEOUT", _DEFAULT_BUSY_TIMEOUT_MS)
    return float(busy) / 1000.0, str(config.get("BACKEND_PASSWORD") or "")


class RedisRunner:
    """Process-local owner of a Redis connection pool for one namespace.

    Args:
        target: ``redis://``, ``rediss://`` or ``unix://`` URL (with db number).
        namespace: Namespace whose keys this runner addresses.
        max_connections: Pool size; callers wait for a free connection.
        pool_timeout: Seconds to wait for a free connection before raising
            ``OperationalError`` (default ``BROKER_BUSY_TIMEOUT / 1000``).
        stale_batch_seconds: Lease of at-least-once batches (negative: never
            recovered).
        config: SimpleBroker config (for the busy timeout and
            ``BROKER_BACKEND_PASSWORD``); the environment when omitted.

    """

    def __init__(
        self,
        target: str,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        max_connections: int = 50,
        pool_timeout: float | None = None,
        stale_batch_seconds: float = 300.0,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        self.options = BackendOptions.parse(
            {
                "namespace": namespace,
                "max_connections": max_connections,
                "stale_batch_seconds": stale_batch_seconds,
                **({} if pool_timeout is None else {"pool_timeout": pool_timeout}),
            }
        )
        self.target = normalize_target(target)
        default_timeout, env_password = _resolve_settings(config)
        self.pool_timeout = (
            default_timeout if self.options.pool_timeout is None else self.options.pool_timeout
        )
        self._password = None if target_has_password(self.target) else (env_password or None)
        self.keys = Keyspace.for_namespace(self.options.namespace)
        self.where = f"{redact_target(self.target)} namespace={self.options.namespace!r}"
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._client: redis.Redis | None = None
        self._scripts: Scripts | None = None
        self._initialized = False
        self._closed = False
        self._clock: HighWaterClock | None = None
        self._schedules: dict[int, MaintenanceSchedule] = {}
        self.maintenance_lock = threading.Lock()
        self.maintenance_due = False  #: the next write/claim carries maintenance

    def __repr__(self) -> str:
        return f"RedisRunner({redact_target(self.target)!r}, namespace={self.options.namespace!r})"

    @property
    def backend_plugin(self) -> _BackendPlugin:
        """Return the redis backend plugin (SimpleBroker's BackendAwareRunner)."""
        from .plugin import redis_backend_plugin

        return cast("_BackendPlugin", redis_backend_plugin)

    @property
    def clock(self) -> HighWaterClock:
        """Return the process-wide cache of the durable high-water mark.

        Shared by every core on this runner, so a short-lived core (an
        ephemeral ``Queue`` operation) does not re-read the high-water.
        """
        clock = self._clock
        if clock is None:
            from .plugin import redis_backend_plugin

            # SimpleBroker's generator reads/advances last_ts through the
            # plugin's read_last_ts/advance_last_ts hooks with this runner.
            clock = HighWaterClock(self, backend_plugin=redis_backend_plugin)  # type: ignore[arg-type]
            self._clock = clock
        return clock

    def maintenance_schedule(self, interval: int) -> MaintenanceSchedule:
        """Return the process-wide maintenance schedule for ``interval``."""
        with self.maintenance_lock:
            schedule = self._schedules.get(interval)
            if schedule is None:
                schedule = self._schedules[interval] = MaintenanceSchedule(interval)
            return schedule

    @property
    def identity(self) -> tuple[str, str | None, str]:
        """Return what makes two runners address the same namespace."""
        return (self.target, self._password, self.options.namespace)

    @property
    def fixed_keys(self) -> list[str]:
        """Return the KEYS list every script receives."""
        return list(self.keys.fixed_keys)

    def connection_kwargs(self) -> dict[str, Any]:
        """Return redis-py connection options shared by sync and async pools."""
        kwargs: dict[str, Any] = {
            "decode_responses": True,
            "socket_connect_timeout": CONNECT_TIMEOUT,
            "socket_timeout": COMMAND_TIMEOUT,
            "retry": Retry(NoBackoff(), 0),
            "client_name": f"simplebroker-redis:{os.getpid()}",
            **_NO_SETINFO,
        }
        if self._password is not None:
            kwargs["password"] = self._password
        return kwargs

    def _ensure_client(self) -> tuple[redis.Redis, Scripts]:
        pid = os.getpid()
        client, scripts = self._client, self._scripts
        if client is not None and scripts is not None and pid == self._pid:
            return client, scripts
        if pid != self._pid:
            # Forked child: drop the parent's pool and lock without touching
            # its sockets (redis-py only shuts sockets down in their own pid).
            self._lock = threading.Lock()
            self.maintenance_lock = threading.Lock()
            self._pid = pid
            self._client = None
            self._scripts = None
            self._initialized = False
        with self._lock:
            if self._closed:
                raise OperationalError(f"RedisRunner for {self.where} is closed")
            if self._client is None or self._scripts is None:
                pool = redis.BlockingConnectionPool.from_url(
                    self.target,
                    max_connections=self.options.max_connections,
                    timeout=self.pool_timeout,
                    **self.connection_kwargs(),
                )
                self._client = redis.Redis(connection_pool=pool)
                self._scripts = Scripts.register(self._client)
            return self._client, self._scripts

    @property
    def client(self) -> redis.Redis:
        """Return this process's client (created on first use)."""
        return self._ensure_client()[0]

    @property
    def scripts(self) -> Scripts:
        """Return this process's registered scripts."""
        return self._ensure_client()[1]

    def execute(self, operation: Callable[[redis.Redis], T], *, idempotent: bool = False) -> T:
        """Run ``operation(client)``, translating errors at this one boundary.

        ``idempotent`` operations are retried once after a connection error.
        """
        attempts = 2 if idempotent else 1
        for attempt in range(attempts):
            try:
                return operation(self.client)
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                if attempt + 1 < attempts and str(exc) != "No connection available.":
                    continue
                raise translate(exc, self.where) from exc
            except redis.RedisError as exc:
                raise translate(exc, self.where) from exc
        raise AssertionError("unreachable")

    def call(self, script: ScriptName, args: Sequence[object], *, idempotent: bool = False) -> Any:
        """Run the named script with the namespace KEYS and ``args``.

        An uninitialized namespace (for example cleaned up by another
        process) is initialized again and the script retried once: scripts
        validate before they write, so the retry cannot double-apply.
        """
        argv = [self.keys.wake_prefix, *args]
        keys = self.fixed_keys

        def run(client: redis.Redis) -> Any:
            return getattr(self.scripts, script)(keys=keys, args=argv, client=client)

        try:
            return self.execute(run, idempotent=idempotent)
        except NamespaceMissing:
            self._initialized = False
            self.ensure_initialized()
            return self.execute(run, idempotent=idempotent)

    def ensure_initialized(self) -> None:
        """Create or validate the namespace once per process (1 round trip)."""
        if self._initialized and self._pid == os.getpid():
            return
        argv = [self.keys.wake_prefix, "init"]
        keys = self.fixed_keys
        self.execute(lambda client: self.scripts.init(keys=keys, args=argv, client=client))
        self._initialized = True

    @property
    def initialized(self) -> bool:
        """Return whether this process already initialized or validated the namespace."""
        return self._initialized and self._pid == os.getpid()

    def mark_initialized(self, value: bool = True) -> None:
        """Record (or forget) that the namespace is known to be initialized."""
        self._initialized = value
        if value:
            self._pid = os.getpid()

    def close(self) -> None:
        """Disconnect this process's pool; the runner reconnects on next use."""
        with self._lock:
            client, self._client, self._scripts = self._client, None, None
        if client is not None and self._pid == os.getpid():
            client.connection_pool.disconnect()

    def shutdown(self) -> None:
        """Close the pool for good; later use raises ``OperationalError``."""
        self.close()
        self._closed = True


_SHARED: dict[tuple[Any, ...], RedisRunner] = {}
_SHARED_LOCK = threading.Lock()


def shared_runner(
    target: str,
    options: BackendOptions,
    config: Mapping[str, Any] | None,
) -> RedisRunner:
    """Return the process-wide runner for (target, options), creating it once.

    Cores built from a target (``create_core``, ephemeral ``Queue``
    operations) borrow these runners, so an operation does not pay for a new
    pool, connection and namespace check each time.
    """
    default_timeout, env_password = _resolve_settings(config)
    key = (
        os.getpid(),
        normalize_target(target),
        options,
        default_timeout,
        env_password,
    )
    with _SHARED_LOCK:
        runner = _SHARED.get(key)
        if runner is None:
            runner = RedisRunner(
                target,
                namespace=options.namespace,
                max_connections=options.max_connections,
                pool_timeout=options.pool_timeout,
                stale_batch_seconds=options.stale_batch_seconds,
                config=config,
            )
            _SHARED[key] = runner
        return runner


def forget_shared_runners(namespace: str | None = None) -> None:
    """Drop cached runners (all, or those of ``namespace``) after cleanup."""
    with _SHARED_LOCK:
        for key in list(_SHARED):
            runner = _SHARED[key]
            if namespace is None or runner.options.namespace == namespace:
                runner.mark_initialized(False)


@atexit.register
def _close_shared_runners() -> None:
    with _SHARED_LOCK:
        runners = list(_SHARED.values())
        _SHARED.clear()
    for runner in runners:
        try:
            runner.close()
        except Exception:  # noqa: BLE001 - best effort at interpreter exit
            pass
