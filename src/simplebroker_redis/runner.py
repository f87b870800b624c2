"""Runners: run typed calls on a pooled connection; one retry-and-translate rule.

:class:`RunnerBase` holds what the sync :class:`RedisRunner` and the asyncio
:class:`~simplebroker_redis.aio.AsyncRedisRunner` share: the options, the
connection settings (:class:`~simplebroker_redis.connection.Connections`),
the key schema, the naming used in errors, how a :class:`~.calls.Call`
becomes a script run, and the one rule for failures:

- every redis-py error is translated into a SimpleBroker exception here
  (:func:`~simplebroker_redis.errors.translate`);
- commands are never retried blindly: a lost reply may hide a committed
  write. Only calls marked ``idempotent`` (reads) are retried, once, after a
  connection error;
- a namespace found uninitialized (cleaned up by another process) is
  initialized again and the call retried once: scripts validate before they
  write, so the retry cannot double-apply;
- on a Cluster or Sentinel target, replies that say the command was refused
  *before* it ran (MOVED, ASK, TRYAGAIN, CLUSTERDOWN, READONLY from a demoted
  primary, LOADING, BUSY, a connection that could not be opened, no primary
  known) are followed or retried with backoff for up to ``pool_timeout``
  seconds; MOVED and ASK go to the node they name;
- with ``wait_replicas``/``wait_aof``, every state-changing script is
  pipelined with ``WAIT``/``WAITAOF`` on the same connection (one round
  trip); too few acknowledgements raise :class:`~.errors.ReplicationTimeout`.

A ``RedisRunner`` opens nothing until first use, and a forked child builds
its own pool the first time it touches the runner (it never reuses its
parent's sockets). Pub/Sub never uses this pool: see :mod:`.activity`.
"""

from __future__ import annotations

import atexit
import os
import re
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Final, TypeVar, Unpack

import redis
import redis.exceptions as rx
import redis.sentinel
from simplebroker import BrokerTarget
from simplebroker.ext import DataError, MaintenanceSchedule, OperationalError

from .calls import Call, key_types
from .calls import init as init_call
from .connection import Address, Connections, Route, config_settings
from .errors import NamespaceMissing, ReplicationTimeout, WrongType, translate
from .ids import HighWaterClock
from .keys import Keyspace
from .options import BackendOptions, OptionKwargs
from .scripts import (
    READ_ONLY,
    SCRIPT_NAMES,
    ScriptName,
    function_name,
    library,
    script_sha,
    script_source,
)

if TYPE_CHECKING:
    from simplebroker.ext import BackendPlugin

R = TypeVar("R")

_POOL_EXHAUSTED = "No connection available."
_FUNCTION_MISSING = "Function not found"

#: Scripts never followed by WAIT: reads, and ``init`` (a namespace lost in a
#: failover is created again by the next call, see :class:`Attempt`).
_NOT_DURABLE: Final[frozenset[str]] = READ_ONLY | {"init"}

#: First and longest pause between retries of a refused command (seconds).
REFUSED_PAUSE: Final[tuple[float, float]] = (0.02, 0.5)

# redis-py's words for a connection that could not be opened (nothing was
# sent), and SentinelManagedConnection's for a READONLY reply.
_NOT_SENT_RE: Final = re.compile(
    r"(?i)error [-\d]+ connecting to|connecting to the cluster|connection refused|"
    r"timeout connecting|previous master is now a slave|no master found"
)


def register_scripts(client: Any) -> dict[ScriptName, Any]:
    """Register every script with ``client`` (no round trip; EVALSHA on first use)."""
    return {name: client.register_script(script_source(name)) for name in SCRIPT_NAMES}


class RunnerBase:
    """Options, connection settings, keys and the failure rule of both runners.

    Args:
        target: ``redis://``, ``rediss://`` or ``unix://`` URL (with db number).
        options: Validated backend options; or pass them as keywords
            (``namespace=``, ``max_connections=``, ``pool_timeout=``,
            ``stale_batch_seconds=``), defaults in :mod:`.options`.
        config: SimpleBroker config (busy timeout, ``BROKER_BACKEND_PASSWORD``);
            the environment when omitted.

    """

    #: The ``redis`` backend plugin (SimpleBroker's ``BackendAwareRunner``
    #: contract). A back-pointer assigned once by :mod:`.plugin`, so this
    #: lower layer never imports the plugin.
    backend_plugin: ClassVar[BackendPlugin]

    def __init__(
        self,
        target: str,
        options: BackendOptions | None = None,
        *,
        config: Mapping[str, Any] | None = None,
        **option_kwargs: Unpack[OptionKwargs],
    ) -> None:
        if options is None:
            options = BackendOptions.parse(option_kwargs)
        elif option_kwargs:
            raise TypeError("pass options or option keywords, not both")
        self.options = options
        self.config = config
        self.connections = Connections(target, options, config)
        self.target = self.connections.target
        self.pool_timeout = self.connections.pool_timeout
        self.keys = Keyspace.for_namespace(options.namespace)
        self.where = f"{self.connections.redacted} namespace={options.namespace!r}"
        self._fixed_keys = tuple(self.keys.fixed_keys)
        self._init_state()

    def _init_state(self) -> None:
        """Set up the subclass's own state (pools, caches); called by ``__init__``."""

    def __repr__(self) -> str:
        name = type(self).__name__
        return f"{name}({self.connections.redacted!r}, namespace={self.keys.namespace!r})"

    @property
    def identity(self) -> tuple[str, str | None, str]:
        """Return what makes two runners address the same namespace."""
        return (*self.connections.identity, self.options.namespace)

    @property
    def broker_target(self) -> BrokerTarget:
        """Return the SimpleBroker target this runner addresses.

        Pass it with the runner, ``Queue(name, db_path=runner.broker_target,
        runner=runner)``, so SimpleBroker does not look for a project file.
        """
        return BrokerTarget(
            backend_name="redis", target=self.target, backend_options=self.options.to_dict()
        )

    def _operation(self, call: Call[Any], command: tuple[Any, ...] | None) -> Callable[[Any], Any]:
        """Return ``call`` as a function of a client or pipeline (sync or asyncio alike).

        ``command`` is the script's command (:meth:`_script_command`), None
        for a call of plain commands. With the backend option ``scripting =
        "eval"`` a script runs by EVALSHA; NOSCRIPT makes :class:`Attempt`
        load it and try again.
        """
        if command is None:
            assert call.command is not None, "a Call names a script or a command"
            return call.command
        return lambda client: client.execute_command(*command)

    def _script_command(self, call: Call[Any]) -> tuple[Any, ...]:
        """Return the FCALL (or EVALSHA) command that runs ``call``'s script."""
        assert call.script is not None, "a Call names a script or a command"
        keys = (*self._fixed_keys, *call.extra_keys) if call.extra_keys else self._fixed_keys
        if self.options.scripting == "eval":
            head: tuple[Any, ...] = ("EVALSHA", script_sha(call.script))
        else:
            head = ("FCALL", function_name(call.script))
        return (*head, len(keys), *keys, self.keys.wake_prefix, *call.args)

    def _attempt(self, call: Call[Any], moved: Callable[[Address | None], None]) -> Attempt:
        deadline = time.monotonic() + self.pool_timeout if self.connections.routed else None
        return Attempt(self.where, self.keys, call, deadline=deadline, moved=moved)

    def durable(self, call: Call[Any]) -> bool:
        """Return whether ``call`` is followed by WAIT/WAITAOF (a state-changing script)."""
        if not self.options.durable or call.idempotent:
            return False
        return call.writes if call.script is None else call.script not in _NOT_DURABLE

    def _pipelined(
        self, pipe: Any, operation: Callable[[Any], Any], call: Call[Any], ask: bool
    ) -> int:
        """Queue ``operation`` on ``pipe`` (after ASKING, before WAITs); return its index."""
        if ask:
            pipe.execute_command("ASKING")
        operation(pipe)
        if self.durable(call):
            timeout_ms = max(1, round(self.options.wait_timeout * 1000))
            if self.options.wait_replicas:
                pipe.execute_command("WAIT", self.options.wait_replicas, timeout_ms)
            if self.options.wait_aof:
                pipe.execute_command("WAITAOF", 1, self.options.wait_replicas, timeout_ms)
        return 1 if ask else 0

    def _settled(self, replies: Sequence[Any], index: int, parse: Callable[[Any], R]) -> R:
        """Return the operation's parsed reply from a pipeline; raise its error or a short WAIT.

        A short WAIT's ``ReplicationTimeout`` carries the parsed reply (it happened).
        """
        reply = replies[index]
        if isinstance(reply, Exception):
            raise reply
        waits = replies[index + 1 :]
        wanted = self.options.wait_replicas
        problem = None
        if wanted and waits:
            acked, waits = waits[0], waits[1:]
            if isinstance(acked, Exception):
                problem = f"WAIT failed: {acked}"
            elif int(acked) < wanted:
                problem = f"{acked} of {wanted} replicas acknowledged it"
        if problem is None and waits:
            fsynced = waits[0]
            if isinstance(fsynced, Exception):
                problem = f"WAITAOF failed: {fsynced}"
            elif int(fsynced[0]) < 1 or int(fsynced[1]) < wanted:
                problem = (
                    f"the AOF of {'the primary and ' if int(fsynced[0]) else ''}"
                    f"{fsynced[1]} of {wanted} replicas fsynced it"
                    + ("" if int(fsynced[0]) else " (not the primary's)")
                )
        if problem is not None:
            raise ReplicationTimeout(
                f"the write to {self.where} happened, but within wait_timeout="
                f"{self.options.wait_timeout:g} s {problem}: it may not survive a failover",
                result=parse(reply),
            )
        return parse(reply)

    def _aof_problem(self, version: tuple[int, ...]) -> OperationalError | None:
        """Return the error when the server's version has no WAITAOF (before 7.2)."""
        if version < (7, 2):
            return OperationalError(
                f"backend option wait_aof needs WAITAOF (Valkey or Redis 7.2+), which the "
                f"server at {self.where} does not have; nothing was written"
            )
        return None


def _loaded(reply: Any) -> None:
    return None


#: Loads the Functions library (idempotent: the same name replaces itself).
LOAD_LIBRARY: Final[Call[None]] = Call(
    _loaded, command=lambda client: client.function_load(library(), replace=True)
)


def load_script(name: ScriptName) -> Call[None]:
    """Return the call that loads script ``name`` for EVALSHA (after NOSCRIPT)."""
    source = script_source(name)
    return Call(_loaded, command=lambda client: client.script_load(source))


def _version(info: Any) -> tuple[int, ...]:
    text = str(info.get("valkey_version") or info.get("redis_version") or "0")
    return tuple(int(part) for part in text.split(".")[:2] if part.isdigit())


#: Asks for the server's version: WAITAOF (``wait_aof``) needs Valkey or Redis 7.2+.
#: (INFO rather than COMMAND INFO: the ACL line grants it, and redis-py cannot
#: parse COMMAND INFO of an unknown command.)
WAITAOF_INFO: Final[Call[tuple[int, ...]]] = Call(
    _version, command=lambda client: client.info("server"), idempotent=True
)


class Attempt:
    """The failure rule around the attempts of one call (a context manager).

    ``with attempt:`` wraps one try. On a redis-py error it raises the
    translated exception, unless the call may be repeated after a *remedy*:
    another call the runner makes first (:attr:`remedy`), whose reply goes to
    :meth:`remedied`:

    - the namespace was found missing: initialize it, then try once more;
    - the Functions library is missing (a server restart, a new cluster
      node): load it, then try once more (nothing ran before);
    - a key had the wrong type (the server does not say which): read the
      key types, and raise a ``DataError`` naming the damaged key.

    An idempotent call is also tried once more after a connection error
    (no remedy). With a ``deadline`` (Cluster, Sentinel), a reply that says
    the command was refused before it ran is retried until the deadline:
    MOVED re-points the route (``moved``), ASK sends the next try to the
    node it names, the others pause first (:attr:`pause`). Any other
    connection error makes the route ask where the primary is next time.
    """

    __slots__ = (
        "_deadline",
        "_moved",
        "_next_ask",
        "_refusals",
        "_remedy",
        "_tried",
        "ask",
        "call",
        "keys",
        "pause",
        "where",
        "wrong_type",
    )

    def __init__(
        self,
        where: str,
        keys: Keyspace,
        call: Call[Any],
        *,
        deadline: float | None = None,
        moved: Callable[[Address | None], None] | None = None,
    ) -> None:
        self.where = where
        self.keys = keys
        self.call = call
        self.wrong_type: WrongType | None = None
        self._remedy: Call[Any] | None = None
        self._tried: set[str] = set()  #: what was done again already (each at most once)
        self._deadline = deadline
        self._moved = moved
        self._refusals = 0
        self._next_ask: Address | None = None
        self.ask: Address | None = None  #: this try goes to that node, after ASKING
        self.pause = 0.0  #: seconds to wait before the next try

    def __enter__(self) -> None:
        self._remedy = None
        self.pause = 0.0
        self.ask, self._next_ask = self._next_ask, None

    def _refused(self, exc: redis.RedisError) -> bool:
        """Return whether to try again: ``exc`` says nothing ran, and time is left."""
        refused = (
            isinstance(
                exc,
                (rx.AskError, rx.TryAgainError, rx.ClusterDownError, rx.ReadOnlyError),
            )
            or (
                isinstance(exc, (rx.ConnectionError, rx.TimeoutError))
                and (isinstance(exc, rx.BusyLoadingError) or bool(_NOT_SENT_RE.search(str(exc))))
            )
            or (isinstance(exc, rx.ResponseError) and str(exc).startswith("BUSY"))
        )
        if not refused:
            if isinstance(exc, (rx.ConnectionError, rx.TimeoutError)) and self._moved:
                self._moved(None)  # the primary may have changed: ask next time
            return False
        assert self._deadline is not None
        if time.monotonic() >= self._deadline:
            return False
        if isinstance(exc, rx.MovedError):
            if self._moved:
                self._moved((str(exc.host), int(exc.port)))
        elif isinstance(exc, rx.AskError):
            self._next_ask = (str(exc.host), int(exc.port))
        else:
            if self._moved and not isinstance(exc, (rx.TryAgainError, rx.BusyLoadingError)):
                self._moved(None)
            first, longest = REFUSED_PAUSE
            self.pause = min(longest, first * 2**self._refusals)
            self._refusals += 1
        return True

    def _once(self, what: str) -> bool:
        if what in self._tried:
            return False
        self._tried.add(what)
        return True

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> bool:
        if not isinstance(exc, redis.RedisError):
            return False
        if self._deadline is not None and self._refused(exc):
            return True
        error = translate(exc, self.where)
        if isinstance(error, WrongType) and self._once("types"):
            error.__cause__ = exc
            self.wrong_type = error
            self._remedy = key_types(self.keys)
            return True
        if self.call.script is not None:
            if isinstance(error, NamespaceMissing) and self.call.script != "init":
                self._remedy = init_call("init") if self._once("init") else None
            elif _FUNCTION_MISSING in str(exc):
                # Once per node: an ASK target may lack it while the source has it.
                self._remedy = LOAD_LIBRARY if self._once(f"load {self.ask}") else None
            elif isinstance(exc, rx.NoScriptError):
                load = self._once(f"load {self.ask}")
                self._remedy = load_script(self.call.script) if load else None
            if self._remedy is not None:
                return True
        if (
            self.call.idempotent
            and isinstance(exc, (redis.ConnectionError, redis.TimeoutError))
            and str(exc) != _POOL_EXHAUSTED
            and self._once("reconnect")
        ):
            return True
        raise error from exc

    @property
    def remedy(self) -> Call[Any] | None:
        """Return the call to make before the next try, if any."""
        return self._remedy

    def remedied(self, reply: Any) -> None:
        """Take the remedy's reply; raise when it ends the call (damaged data)."""
        if self.wrong_type is not None:
            raise self.damaged(reply)

    def damaged(self, types: dict[str, tuple[str, str]]) -> DataError:
        """Return the error for :attr:`wrong_type`, naming the first wrong-typed key found."""
        assert self.wrong_type is not None
        for key, (kind, expected) in types.items():
            if kind not in ("none", expected):
                error = DataError(
                    f"damaged simplebroker-redis data in {self.where}: {key} holds a "
                    f"{kind}, expected a {expected}"
                )
                error.__cause__ = self.wrong_type
                return error
        return self.wrong_type


class RedisRunner(RunnerBase):
    """Process-local owner of a Redis connection pool for one namespace.

    See :class:`RunnerBase` for the arguments. Thread-safe; fork-safe.
    """

    def _init_state(self) -> None:
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._route: Route | None = None
        self._aof_checked = False
        self._initialized = False
        self._closed = False
        self._clock: HighWaterClock | None = None
        self._schedules: dict[int, MaintenanceSchedule] = {}
        self.maintenance_lock = threading.Lock()
        self.maintenance_due = False  #: the next write/claim carries maintenance

    @property
    def clock(self) -> HighWaterClock:
        """Return the process-wide cache of the durable high-water mark.

        Shared by every core on this runner, so a short-lived core (an
        ephemeral ``Queue`` operation) does not re-read the high-water.
        """
        clock = self._clock
        if clock is None:
            # SimpleBroker's generator reads/advances last_ts through the
            # plugin's read_last_ts/advance_last_ts hooks with this runner.
            # SimpleBroker types the runner as its SQLRunner protocol, which
            # a direct backend's runner does not implement (never used as SQL).
            clock = self._clock = HighWaterClock(
                self,  # type: ignore[arg-type]
                backend_plugin=self.backend_plugin,
            )
        return clock

    def maintenance_schedule(self, interval: int) -> MaintenanceSchedule:
        """Return the process-wide maintenance schedule for ``interval``."""
        with self.maintenance_lock:
            schedule = self._schedules.get(interval)
            if schedule is None:
                schedule = self._schedules[interval] = MaintenanceSchedule(interval)
            return schedule

    def _ensure_route(self) -> Route:
        pid = os.getpid()
        route = self._route
        if route is not None and pid == self._pid:
            return route
        if pid != self._pid:
            # Forked child: drop the parent's pools and lock without touching
            # its sockets (redis-py only shuts sockets down in their own pid).
            self._lock = threading.Lock()
            self.maintenance_lock = threading.Lock()
            self._pid = pid
            self._route = None
            self._initialized = False
        with self._lock:
            if self._closed:
                raise OperationalError(f"RedisRunner for {self.where} is closed")
            if self._route is None:
                self._route = Route(self.connections)
            return self._route

    @property
    def client(self) -> redis.Redis:
        """Return this process's client of the namespace's primary (created on first use)."""
        route = self._ensure_route()
        try:
            return route.primary()
        except redis.RedisError as exc:
            raise translate(exc, self.where) from exc

    @property
    def scripts(self) -> Mapping[ScriptName, Any]:
        """Return redis-py ``Script`` objects of every script, on this process's client."""
        return register_scripts(self.client)

    def run(self, call: Call[R]) -> R:
        """Run ``call`` (one round trip) and return its parsed reply."""
        route = self._ensure_route()
        command = None if call.script is None else self._script_command(call)
        operation, attempt = self._operation(call, command), self._attempt(call, route.moved)
        if self.durable(call) and self.options.wait_aof and not self._aof_checked:
            problem = self._aof_problem(self.run(WAITAOF_INFO))
            if problem is not None:
                raise problem
            self._aof_checked = True
        while True:
            with attempt:
                client = route.primary() if attempt.ask is None else route.node(attempt.ask)
                if attempt.ask is None and not self.durable(call):
                    if command is not None:
                        return call.parse(direct(client, command))
                    return call.parse(operation(client))
                pipe = client.pipeline(transaction=False)
                index = self._pipelined(pipe, operation, call, attempt.ask is not None)
                return self._settled(pipe.execute(raise_on_error=False), index, call.parse)
            if attempt.pause:
                time.sleep(attempt.pause)
            if attempt.remedy is not None:
                if attempt.ask is not None:  # load the scripts where ASK sent the try
                    attempt.remedied(self._on_node(route.node(attempt.ask), attempt.remedy))
                else:
                    attempt.remedied(self.run(attempt.remedy))

    def _on_node(self, client: redis.Redis, call: Call[R]) -> R:
        """Run the plain-command ``call`` once on ``client`` (a remedy on an ASK target)."""
        assert call.command is not None
        try:
            return call.parse(call.command(client))
        except redis.RedisError as exc:
            raise translate(exc, self.where) from exc

    def execute(
        self,
        operation: Callable[[redis.Redis], R],
        *,
        idempotent: bool = False,
        writes: bool = False,
    ) -> R:
        """Run plain commands ``operation(client)`` under the same failure rule.

        ``writes``: ``operation`` is one command that changes data; with the
        durability options WAIT/WAITAOF follow it.
        """
        call = Call(_same, command=operation, idempotent=idempotent, writes=writes)
        result: R = self.run(call)
        return result

    def ensure_initialized(self) -> None:
        """Create or validate the namespace once per process (1 round trip)."""
        if self._initialized and self._pid == os.getpid():
            return
        self.run(init_call("init"))
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
            route, self._route = self._route, None
        if route is not None and self._pid == os.getpid():
            route.close()

    def shutdown(self) -> None:
        """Close the pool for good; later use raises ``OperationalError``."""
        self.close()
        self._closed = True


def _same(value: R) -> R:
    return value


try:
    from hiredis import pack_command as _hiredis_pack
except ImportError:  # the optional hiredis extra
    pack_command: Callable[[tuple[Any, ...]], bytes] | None = None
else:
    pack_command = _hiredis_pack


#: Connections :func:`direct` keeps out of a pool between calls, at most: a
#: checkout from redis-py's pool (its lock and queue, metrics, a pid check)
#: and the release cost 15-18 us of CPU, half of what a loopback round trip
#: costs the client.
KEEP_IDLE: Final[int] = 4
#: A pool keeps at most one connection per this many it may open, so seven
#: in eight stay available to pipelines, plain commands and Pub/Sub (pools
#: of fewer than 8 keep none).
KEEP_IDLE_SHARE: Final[int] = 8


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


def kept_connections(pool: Any) -> int:
    """Return how many idle connections :func:`direct` holds out of ``pool`` now."""
    idle = getattr(pool, _IDLE_ATTRIBUTE, None)
    return 0 if idle is None else len(idle.connections)


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
        if pack_command is None:
            connection.send_command(*command)
        else:  # what redis-py's hiredis packer ends in, without its per-argument pass
            connection.send_packed_command((pack_command(command),))
        reply = connection.read_response()
    except BaseException:
        pool.release(connection)
        raise
    if idle is None:
        pool.release(connection)
    else:
        idle.give(connection)
    return reply


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
    key = (os.getpid(), target, options, *config_settings(config))
    with _SHARED_LOCK:
        runner = _SHARED.get(key)
        if runner is None:
            runner = _SHARED[key] = RedisRunner(target, options, config=config)
        return runner


def forget_shared_runners(namespace: str | None = None) -> None:
    """Forget that shared runners (all, or those of ``namespace``) are initialized."""
    with _SHARED_LOCK:
        for runner in _SHARED.values():
            if namespace is None or runner.options.namespace == namespace:
                runner.mark_initialized(False)


def release_shared_runners(namespace: str) -> None:
    """Drop and disconnect the shared runners of ``namespace`` (it was deleted).

    Without this a process that deletes many namespaces (a test suite, a tool
    sweeping old ones) would keep a pool of connections open for each of them
    until it exits. A core still holding one of these runners reconnects, and
    initializes the namespace again, on its next call.
    """
    with _SHARED_LOCK:
        mine = [key for key, runner in _SHARED.items() if runner.options.namespace == namespace]
        released = [_SHARED.pop(key) for key in mine]
    for runner in released:
        runner.mark_initialized(False)
        runner.close()


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
