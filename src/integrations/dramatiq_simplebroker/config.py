"""The broker's settings: where it connects, its lease timing, dead letters, priorities.

Where the broker connects, in this order (the rule of
:mod:`simplebroker_redis.server`, which the tools and every integration
follow):

1. ``url``: a backend target (``redis://``, ``rediss://``,
   ``redis+sentinel://``, ``redis+cluster://``; the grammar of
   :func:`simplebroker_redis.targets.parse_target`), also written
   ``simplebroker+redis://...`` as Celery's settings spell it;
2. ``$SIMPLEBROKER_REDIS_URL``;
3. the SimpleBroker project of the working directory, found as the
   ``broker`` command finds it (a ``.broker.toml`` with ``backend =
   "redis"`` here or above, or ``BROKER_BACKEND=redis``): its target and
   ``[backend_options]``, so a worker and ``broker list`` see the same
   queues.

``namespace=`` wins over the project's. Every refused value is a
:class:`ConfigurationError` naming the keyword.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from simplebroker_redis import queue_names
from simplebroker_redis.lease_timing import LeaseTiming, TimingError, lease_timing
from simplebroker_redis.priorities import priority_queue
from simplebroker_redis.server import Target, TargetError, choose_server

#: The prefix Celery-style settings put before a backend target.
SCHEME_PREFIX: Final[str] = "simplebroker+"

#: Suffix of a queue's dead-letter queue (Dramatiq's RedisBroker says ``.XQ`` too).
DEAD_LETTER_SUFFIX: Final[str] = ".XQ"

#: Dramatiq's default time to live of dead messages (ms): 7 days, as its RedisBroker.
DEFAULT_DEAD_MESSAGE_TTL: Final[int] = 86_400_000 * 7

#: Deliveries after which a message whose worker keeps dying is dead-lettered
#: (the Retries middleware's default ``max_retries`` is 20).
DEFAULT_MAX_DELIVERIES: Final[int] = 20

#: Seconds an idle consumer waits for a wake-up before it asks the server
#: anyway (wake-ups are hints; a missed one costs at most this).
DEFAULT_IDLE_RECHECK: Final[float] = 30.0


class ConfigurationError(ValueError):
    """A keyword of the broker or the result backend is invalid (the message names it)."""


@dataclass(frozen=True, slots=True)
class Settings:
    """What a broker (and the result backend beside it) was configured with."""

    target: Target
    timing: LeaseTiming = field(default_factory=LeaseTiming)
    max_deliveries: int | None = DEFAULT_MAX_DELIVERIES
    dead_message_ttl: int = DEFAULT_DEAD_MESSAGE_TTL  #: ms
    idle_recheck: float = DEFAULT_IDLE_RECHECK


def choose_target(
    url: str | None, namespace: str | None, backend_options: Mapping[str, Any] | None = None
) -> Target:
    """Return where to connect (see the module docstring).

    Raises:
        ConfigurationError: Nothing names a server, the URL or a backend
            option is malformed, or the project's backend is not ``redis``.

    """
    if url is not None and url.startswith(SCHEME_PREFIX):
        url = url[len(SCHEME_PREFIX) :]
    try:
        return choose_server(url, namespace=namespace, options=backend_options)
    except TargetError as exc:
        raise ConfigurationError(str(exc)) from None
    except (TypeError, ValueError) as exc:  # SimpleBroker's InvalidConfigError is a ValueError
        raise ConfigurationError(f"backend option: {exc}") from None


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(f"{name} must be an integer >= 1")
    return value


def make_settings(
    target: Target,
    *,
    lease_seconds: object = None,
    heartbeat_interval: object = None,
    recover_interval: object = None,
    max_deliveries: object = DEFAULT_MAX_DELIVERIES,
    dead_message_ttl: object = DEFAULT_DEAD_MESSAGE_TTL,
    idle_recheck: object = DEFAULT_IDLE_RECHECK,
) -> Settings:
    """Return checked settings (None timing values take the shared defaults).

    Raises:
        ConfigurationError: A value is out of range (the message names it).

    """
    try:
        timing = lease_timing(lease_seconds, heartbeat_interval, recover_interval)
    except TimingError as exc:
        raise ConfigurationError(str(exc)) from None
    most = None if max_deliveries is None else _positive_int("max_deliveries", max_deliveries)
    ttl = _positive_int("dead_message_ttl", dead_message_ttl)
    if isinstance(idle_recheck, bool) or not isinstance(idle_recheck, (int, float)):
        raise ConfigurationError("idle_recheck must be a number of seconds > 0")
    if not 0 < idle_recheck < float("inf"):
        raise ConfigurationError("idle_recheck must be a number of seconds > 0")
    return Settings(target, timing, most, ttl, float(idle_recheck))


def storage_queue(queue: str, priority: int) -> str:
    """Return where ``queue``'s messages of actor priority ``priority`` are stored.

    Priority 0 (Dramatiq's default) is the queue itself, priority *P* > 0
    the queue ``<queue>.p<P>`` (:func:`~simplebroker_redis.priorities.priority_queue`),
    *P* < 0 ``<queue>.pm<-P>`` (``default.pm5`` for -5); every name goes
    through the integrations' one mapping of queue names
    (:func:`~simplebroker_redis.queue_names.storage_queue`: a Dramatiq name is
    kept unless it holds ``--`` or a ``-`` before two upper-case hex digits).

    Raises:
        ConfigurationError: The name cannot be stored.

    """
    name = priority_queue(queue, priority) if priority >= 0 else f"{queue}.pm{-priority}"
    try:
        return queue_names.storage_queue(name)
    except ValueError as exc:
        raise ConfigurationError(f"queue {queue!r} (priority {priority}): {exc}") from None


def dead_letter_queue(queue: str) -> str:
    """Return where the dead letters of ``queue`` (a canonical Dramatiq name) are stored."""
    return queue_names.storage_queue(queue + DEAD_LETTER_SUFFIX)
