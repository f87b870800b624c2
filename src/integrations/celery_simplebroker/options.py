"""Options of the transport, the target URL, and Celery queue names in SimpleBroker.

A Celery queue is stored under :func:`~simplebroker_redis.queue_names.storage_queue`
of its name (one mapping for every integration): ``celery`` as it is,
``celery@host.celery.pidbox`` as ``celery-40host.celery.pidbox``.

Celery passes ``broker_transport_options`` to the transport and
``result_backend_transport_options`` to the result backend; both accept
``namespace``, ``max_connections`` and ``pool_timeout``. The lease options
only concern the transport. See ``docs/celery.md`` for the table.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
from collections.abc import Iterable, Mapping
from typing import Any, Final, Literal
from urllib.parse import quote

from simplebroker_redis.lease_timing import LeaseTiming, TimingError, lease_timing
from simplebroker_redis.priorities import levels, priority_queue
from simplebroker_redis.queue_names import storage_queue as storage_queue  # re-exported
from simplebroker_redis.server import Target, TargetError, choose_server
from simplebroker_redis.targets import redact_target
from simplebroker_redis.validation import number_problem

logger = logging.getLogger("celery_simplebroker")

#: Longest sleep of an idle worker between two reservations (wake-ups are hints).
DEFAULT_IDLE_RECHECK: Final[float] = 10.0

#: Seconds a publish waits on a server it cannot reach (each try's connect and
#: reply), and after which kombu's retries of it start no new try (see
#: :mod:`.publishing`): ``delay()`` fails within about this long, at worst twice.
DEFAULT_PUBLISH_TIMEOUT: Final[float] = 5.0

#: Most messages one reservation takes when the prefetch window is unlimited.
DEFAULT_RESERVE_BATCH: Final[int] = 16

#: ``priority_order``: ``"amqp"`` reads priority 9 first (the default), ``"redis"``
#: reads 0 first, as Celery's Redis transport does.
PRIORITY_ORDERS: Final[tuple[str, ...]] = ("amqp", "redis")

#: Transport aliases kombu resolves for our URLs: ``simplebroker`` for the
#: first URL (kombu splits ``simplebroker+redis://...`` at its ``+``), the
#: others for failover alternates (kombu's ``switch()`` takes the whole scheme).
FAILOVER_SCHEMES: Final[tuple[str, ...]] = ("redis", "rediss", "unix")


class ConfigurationError(ValueError):
    """A transport or result backend option is invalid."""


#: What kombu and Celery pass when no server is named: nothing, kombu's default
#: host name, or ``simplebroker://``.
_NO_SERVER: Final[frozenset[str]] = frozenset({"", "localhost", "simplebroker:", "simplebroker:/"})


def resolve_target(url: str | None) -> Target:
    """Return the server of a broker or result backend URL (without ``simplebroker+``).

    A URL that names no server (``simplebroker://``) means what it means to
    every integration: ``$SIMPLEBROKER_REDIS_URL``, else the SimpleBroker
    project's ``.broker.toml`` and its ``[backend_options]``
    (:mod:`simplebroker_redis.server`). Either must follow the backend's
    target grammar.

    Raises:
        ConfigurationError: No server is named, or the target is malformed
            (the grammar's message: the fault and the accepted forms).

    """
    named = url or ""
    try:
        return choose_server(
            None if named.rstrip("/") in _NO_SERVER else named,
            source="the broker URL",
            asked="a server in the broker URL (simplebroker+redis://host:port/db)",
        )
    except (TargetError, ValueError) as exc:
        raise ConfigurationError(str(exc)) from None


def client_target(client: Any) -> Target:
    """Return the server of a kombu connection: its first URL or a failover alternate.

    kombu keeps a first ``simplebroker+redis://...`` URL whole in
    ``hostname``; when it fails over to an alternate (``broker_url = "a;b"``)
    it parses that URL instead, into ``transport_cls`` (the scheme, e.g.
    ``simplebroker+redis``), ``hostname``, ``port``, ``userid``, ``password``
    and ``virtual_host`` (the database), which this puts back together.
    Cluster and Sentinel targets list their nodes in one URL and fail over
    on their own; as alternates they are refused.

    Raises:
        ConfigurationError: An alternate is a Cluster or Sentinel target.

    """
    for alternate in getattr(client, "alt", None) or ():
        if "+cluster://" in str(alternate) or "+sentinel://" in str(alternate):
            raise ConfigurationError(
                "a redis+cluster:// or redis+sentinel:// target fails over on its own: list its "
                "nodes in one URL, not as alternate broker URLs (';')"
            )
    hostname = client.hostname
    scheme = str(client.transport_cls).rpartition("+")[2]
    if (not hostname and scheme != "unix") or "://" in (hostname or ""):
        return resolve_target(hostname)
    return Target(_alternate_url(client, hostname, scheme), source="the broker URL")


def _alternate_url(client: Any, hostname: Any, scheme: str) -> str:
    """Return the URL of a failover alternate, from the parts kombu parsed it into."""
    if scheme not in FAILOVER_SCHEMES:
        scheme = "redis"  # a bare host name: kombu's hostname= with the transport given
    credentials = ""
    if client.userid or client.password:
        credentials = quote(client.userid or "", safe="")
        if client.password:
            credentials += ":" + quote(str(client.password), safe="")
        credentials += "@"
    if scheme == "unix":
        path = str(client.virtual_host or "").lstrip("/")
        return f"unix://{credentials}/{path}"
    port = f":{client.port}" if client.port else ""
    host = f"[{hostname}]" if ":" in str(hostname) else str(hostname)
    database = str(client.virtual_host or "").strip("/")
    return f"{scheme}://{credentials}{host}{port}" + (f"/{database}" if database else "")


def shown_url(url: str | None, include_password: bool = False) -> str:
    """Return ``url`` as Celery shows it (banner, logs): ``simplebroker+<target>``.

    Celery's and kombu's own URL sanitizers read one host and port, so
    they fail on a cluster's or Sentinel's list of hosts; the backend's
    redaction handles every target form. Without ``include_password`` a
    password is shown as ``***``.
    """
    if not url:
        return "simplebroker://"
    shown = url if include_password else redact_target(url)
    return shown if shown.startswith("simplebroker") else f"simplebroker+{shown}"


def _number(options: Mapping[str, Any], name: str, default: float) -> float:
    value = options.get(name, default)
    problem = number_problem(value, bound=0, side=">")
    if problem is not None:
        raise ConfigurationError(f"transport option {name!r} must be {problem}")
    return float(value)


def _optional_count(options: Mapping[str, Any], name: str) -> int | None:
    value = options.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(f"transport option {name!r} must be an integer >= 1 or None")
    return value


_DEFAULT_TIMING: Final[LeaseTiming] = LeaseTiming()


@dataclasses.dataclass(frozen=True, slots=True)
class TransportOptions:
    """The transport's validated ``broker_transport_options``.

    The options of its runner (``namespace``, ``max_connections``,
    ``pool_timeout`` and :data:`PASSED_OPTIONS`) are the backend's own,
    checked where the runner is made (:func:`runner_options`).
    """

    lease_seconds: float = _DEFAULT_TIMING.lease_seconds
    heartbeat_interval: float = _DEFAULT_TIMING.heartbeat_seconds
    recover_interval: float = _DEFAULT_TIMING.recover_seconds
    idle_recheck: float = DEFAULT_IDLE_RECHECK
    publish_timeout: float = DEFAULT_PUBLISH_TIMEOUT
    reserve_batch: int = DEFAULT_RESERVE_BATCH
    max_deliveries: int | None = None
    dead_letter_queue: str | None = None
    priorities: bool = True
    priority_order: Literal["amqp", "redis"] = "amqp"
    task_index: bool | None = None  #: index sent tasks by id (None: the environment's rule)
    task_stats: bool | None = None  #: count tasks per name (None: the environment's rule)

    @property
    def timing(self) -> LeaseTiming:
        """Return the lease, heartbeat and recovery timing of the transport's workers."""
        return LeaseTiming(self.lease_seconds, self.heartbeat_interval, self.recover_interval)

    def levels(self, queue: str) -> tuple[str, ...]:
        """Return the storage queues of ``queue`` (storage name) in read order.

        With priorities (the default) ``queue.p9`` ... ``queue.p1``, then
        ``queue``; with ``priority_order = "redis"`` ``queue``, then
        ``queue.p1`` ... ``queue.p9``; without priorities ``queue`` alone.
        """
        if not self.priorities:
            return (queue,)
        if self.priority_order == "redis":
            return tuple(reversed(levels(queue)))
        return levels(queue)

    def level_of(self, queue: str, priority: int) -> str:
        """Return the storage queue of ``queue``'s (storage name) messages of ``priority``."""
        return priority_queue(queue, priority) if self.priorities else queue

    @classmethod
    def parse(cls, options: Mapping[str, Any]) -> TransportOptions:
        """Validate Celery's ``broker_transport_options`` (unknown keys are ignored)."""
        try:
            timing = lease_timing(
                options.get("lease_seconds"),
                options.get("heartbeat_interval"),
                options.get("recover_interval"),
            )
        except TimingError as exc:
            raise ConfigurationError(
                f"transport option {exc.name!r} must be {exc.problem}"
            ) from None
        dead_letter = options.get("dead_letter_queue")
        max_deliveries = _optional_count(options, "max_deliveries")
        if max_deliveries is not None and not dead_letter:
            raise ConfigurationError("max_deliveries needs a dead_letter_queue")
        batch = options.get("reserve_batch", DEFAULT_RESERVE_BATCH)
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ConfigurationError("transport option 'reserve_batch' must be an integer >= 1")
        priorities = options.get("priorities", True)
        if not isinstance(priorities, bool):
            raise ConfigurationError("transport option 'priorities' must be True or False")
        order = options.get("priority_order", "amqp")
        if order not in PRIORITY_ORDERS:
            raise ConfigurationError(
                "transport option 'priority_order' must be 'amqp' (9 first) or 'redis' (0 first)"
            )
        switches = {name: _switch(options, name) for name in ("task_index", "task_stats")}
        return cls(
            **switches,
            lease_seconds=timing.lease_seconds,
            heartbeat_interval=timing.heartbeat_seconds,
            recover_interval=timing.recover_seconds,
            idle_recheck=_number(options, "idle_recheck", DEFAULT_IDLE_RECHECK),
            publish_timeout=_number(options, "publish_timeout", DEFAULT_PUBLISH_TIMEOUT),
            reserve_batch=batch,
            max_deliveries=max_deliveries,
            dead_letter_queue=storage_queue(str(dead_letter)) if dead_letter else None,
            priorities=priorities,
            priority_order=order,
        )


def _switch(options: Mapping[str, Any], name: str) -> bool | None:
    value = options.get(name)
    if value is not None and not isinstance(value, bool):
        raise ConfigurationError(f"transport option {name!r} must be True, False or None")
    return value


def retry_window(conf: Mapping[str, Any]) -> float:
    """Return the seconds a task's result store is retried: the broker's lease.

    The transport's ``lease_seconds`` when the app's broker transport
    options give a valid one, else the default lease (see :mod:`.fencing`).
    """
    options = conf.get("broker_transport_options") or {}
    lease = options.get("lease_seconds") if isinstance(options, Mapping) else None
    if lease is None or number_problem(lease, bound=0, side=">") is not None:
        return _DEFAULT_TIMING.lease_seconds
    return float(lease)


#: Backend options (README, ``[backend_options]``) the transport and the result
#: backend pass through from their ``*_transport_options`` when given.
PASSED_OPTIONS: Final[tuple[str, ...]] = (
    "scripting",
    "wait_replicas",
    "wait_timeout",
    "wait_aof",
    "sentinel_password",
)

#: Options of the runner, in the transport's and the result backend's options.
RUNNER_OPTIONS: Final[tuple[str, ...]] = (
    "namespace",
    "max_connections",
    "pool_timeout",
    *PASSED_OPTIONS,
)


#: Options kombu itself reads from any transport's options (its connection
#: retry policy, the virtual transport's body encoding and dead-letter queue).
KOMBU_OPTIONS: Final[tuple[str, ...]] = (
    "max_retries",
    "interval_start",
    "interval_step",
    "interval_max",
    "connect_retries_timeout",
    "body_encoding",
    "deadletter_queue",
)

#: Names this transport knows in ``broker_transport_options``.
TRANSPORT_OPTIONS: Final[tuple[str, ...]] = (
    *(field.name for field in dataclasses.fields(TransportOptions)),
    *RUNNER_OPTIONS,
    *KOMBU_OPTIONS,
)

#: Names the result backend knows in ``result_backend_transport_options``
#: (``global_keyprefix`` is Celery's own: it prefixes the entries' keys).
BACKEND_OPTIONS: Final[tuple[str, ...]] = (*RUNNER_OPTIONS, "global_keyprefix")

#: Options of Celery's Redis transport that a migrated configuration may
#: still carry, and what stands in for them here.
_REPLACED: Final[dict[str, str]] = {
    "visibility_timeout": (
        "there is no visibility timeout: a worker's messages are held under a lease"
        " ('lease_seconds') renewed while it lives"
    ),
    "unacked_restore_interval": "a dead worker's messages come back after 'lease_seconds'",
    "unacked_restore_throttle": "a dead worker's messages come back after 'lease_seconds'",
    "polling_interval": (
        "this transport does not poll: an idle worker sleeps until a wake-up,"
        " at most 'idle_recheck' seconds"
    ),
    "global_keyprefix": "keys live under the 'namespace' option",
    "priority_steps": (
        "priorities 0-9 are ten distinct levels ('priorities' turns them off,"
        " 'priority_order' = 'redis' reads 0 first)"
    ),
    "queue_order_strategy": "queues are read in kombu's round-robin order",
}

_warned: set[tuple[str, str]] = set()


def warn_unknown_options(setting: str, options: Mapping[str, Any], known: Iterable[str]) -> None:
    """Log, once per process, each name of ``options`` that ``known`` does not list.

    Unknown names are ignored, as every kombu transport ignores another's
    options (a configuration moved from Celery's Redis transport keeps
    working), but a typo or a Redis-transport option that means nothing
    here should not pass unnoticed.
    """
    names = tuple(known)
    for name in options:
        if name in names or (setting, name) in _warned:
            continue
        _warned.add((setting, name))
        if name in _REPLACED:
            logger.warning("%s: %r is ignored: %s", setting, name, _REPLACED[name])
            continue
        close = difflib.get_close_matches(str(name), names, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        logger.warning(
            "%s: %r is not an option of celery_simplebroker (ignored)%s", setting, name, hint
        )


def runner_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """Return the backend options of a transport's or result backend's options.

    See :data:`RUNNER_OPTIONS`; None stands for one not given (an empty
    ``namespace`` too), which :meth:`~simplebroker_redis.server.Target.with_options`
    leaves at the backend's default. The backend checks them where the
    runner is made (``Target.runner`` raises ``InvalidConfigError``,
    naming the option).
    """
    namespace, pool = options.get("namespace"), options.get("max_connections")
    timeout = options.get("pool_timeout")
    return {
        "namespace": str(namespace) if namespace else None,
        "max_connections": None if pool is None else int(pool),
        "pool_timeout": None if timeout is None else float(timeout),
        **{name: options[name] for name in PASSED_OPTIONS if name in options},
    }
