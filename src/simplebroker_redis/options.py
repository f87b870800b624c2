"""Backend options (``[backend_options]``): their names, defaults and validation.

:class:`BackendOptions` validates the options. The targets they go with
follow one grammar, defined (and imported from) :mod:`.targets`. The
password comes from the URL or, when the URL has none, from
``BROKER_BACKEND_PASSWORD``; passwords never reach an error message, a log
line or a ``repr`` (:func:`.targets.redact_target`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, TypedDict

from simplebroker.ext import InvalidConfigError

from .keys import DEFAULT_NAMESPACE, validate_namespace
from .validation import number_problem

__all__ = [
    "DEFAULT_MAX_CONNECTIONS",
    "OPTION_NAMES",
    "BackendOptions",
    "OptionKwargs",
]

#: Connections a runner's pool may open.
DEFAULT_MAX_CONNECTIONS: Final[int] = 50

#: Seconds before an at-least-once batch counts as stale (negative: never).
DEFAULT_STALE_BATCH_SECONDS: Final[float] = 300.0

#: Replicas that must acknowledge each state change (0: do not wait).
DEFAULT_WAIT_REPLICAS: Final[int] = 0

#: Seconds to wait for those acknowledgements before ``ReplicationTimeout``.
DEFAULT_WAIT_TIMEOUT: Final[float] = 1.0

#: How scripts run on the server: one Functions library (FCALL), or EVALSHA.
SCRIPTING_MODES: Final[tuple[str, ...]] = ("functions", "eval")

#: Every ``[backend_options]`` name the backend accepts.
OPTION_NAMES: Final[tuple[str, ...]] = (
    "namespace",
    "max_connections",
    "pool_timeout",
    "stale_batch_seconds",
    "scripting",
    "wait_replicas",
    "wait_timeout",
    "wait_aof",
    "sentinel_password",
)


def _invalid(name: str, value: object, expected: str) -> InvalidConfigError:
    shown = repr(value) if name != "namespace" or isinstance(value, str) else "..."
    return InvalidConfigError(
        key=f"backend_options.{name}",
        source="redis backend_options",
        expected=expected,
        value_display=shown[:80],
    )


def _number(name: str, value: object) -> float:
    problem = number_problem(value)
    if problem is not None:
        raise _invalid(name, value, problem)
    return float(value)  # type: ignore[arg-type] # a number, checked above


class OptionKwargs(TypedDict, total=False):
    """The backend options as keyword arguments (``RedisRunner(url, namespace=...)``)."""

    namespace: str
    max_connections: int
    pool_timeout: float | None
    stale_batch_seconds: float
    scripting: str
    wait_replicas: int
    wait_timeout: float
    wait_aof: bool
    sentinel_password: str | None


@dataclass(frozen=True, slots=True)
class BackendOptions:
    """Validated ``[backend_options]`` of the redis backend."""

    namespace: str = DEFAULT_NAMESPACE
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    pool_timeout: float | None = None  #: None: BROKER_BUSY_TIMEOUT / 1000
    stale_batch_seconds: float = DEFAULT_STALE_BATCH_SECONDS
    #: "functions": one library loaded once, each call an FCALL (faster);
    #: "eval": each call an EVALSHA (for ACLs or servers without FUNCTION LOAD).
    scripting: str = "functions"
    #: After each state-changing script, WAIT for this many replicas (0: off).
    wait_replicas: int = DEFAULT_WAIT_REPLICAS
    #: Seconds WAIT (and WAITAOF) may take before ``ReplicationTimeout``.
    wait_timeout: float = DEFAULT_WAIT_TIMEOUT
    #: Also WAITAOF: the primary's AOF and ``wait_replicas`` replicas' fsynced.
    wait_aof: bool = False
    #: Password of the sentinels themselves (``redis+sentinel://`` targets only).
    sentinel_password: str | None = dataclasses.field(default=None, repr=False)

    @classmethod
    def parse(cls, options: Mapping[str, Any] | None) -> BackendOptions:
        """Validate a raw option mapping; unknown names and bad types raise."""
        raw = dict(options or {})
        for name in raw:
            if name not in OPTION_NAMES:
                raise InvalidConfigError(
                    key=f"backend_options.{name}",
                    source="redis backend_options",
                    expected="one of " + ", ".join(OPTION_NAMES),
                    value_display="(unknown option)",
                )
        namespace = raw.get("namespace", DEFAULT_NAMESPACE)
        try:
            validate_namespace(namespace)
        except (TypeError, ValueError) as exc:
            raise _invalid("namespace", namespace, str(exc)) from None
        max_connections = raw.get("max_connections", DEFAULT_MAX_CONNECTIONS)
        if (
            isinstance(max_connections, bool)
            or not isinstance(max_connections, int)
            or max_connections < 1
        ):
            raise _invalid("max_connections", max_connections, "an integer >= 1")
        pool_timeout = raw.get("pool_timeout")
        if pool_timeout is not None:
            pool_timeout = _number("pool_timeout", pool_timeout)
            if pool_timeout < 0:
                raise _invalid("pool_timeout", pool_timeout, "seconds >= 0")
        stale = _number(
            "stale_batch_seconds",
            raw.get("stale_batch_seconds", DEFAULT_STALE_BATCH_SECONDS),
        )
        scripting = raw.get("scripting", "functions")
        if scripting not in SCRIPTING_MODES:
            raise _invalid("scripting", scripting, "'functions' or 'eval'")
        return cls(namespace, max_connections, pool_timeout, stale, scripting, *_durability(raw))

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON-safe mapping form (SimpleBroker transports it)."""
        out: dict[str, Any] = {
            "namespace": self.namespace,
            "max_connections": self.max_connections,
            "stale_batch_seconds": self.stale_batch_seconds,
            "scripting": self.scripting,
        }
        if self.pool_timeout is not None:
            out["pool_timeout"] = self.pool_timeout
        if self.wait_replicas or self.wait_aof:
            out.update(
                wait_replicas=self.wait_replicas,
                wait_timeout=self.wait_timeout,
                wait_aof=self.wait_aof,
            )
        if self.sentinel_password is not None:
            out["sentinel_password"] = self.sentinel_password
        return out

    @property
    def durable(self) -> bool:
        """Return whether state changes wait for replicas (WAIT) or AOF fsyncs (WAITAOF)."""
        return self.wait_replicas > 0 or self.wait_aof

    def stale_batch_ns(self) -> int | None:
        """Return the stale-batch lease in integer nanoseconds (None: never)."""
        if self.stale_batch_seconds < 0:
            return None
        return round(self.stale_batch_seconds * 1_000_000_000)


def _durability(raw: Mapping[str, Any]) -> tuple[int, float, bool, str | None]:
    """Validate ``wait_replicas``, ``wait_timeout``, ``wait_aof`` and ``sentinel_password``."""
    replicas = raw.get("wait_replicas", DEFAULT_WAIT_REPLICAS)
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
        raise _invalid("wait_replicas", replicas, "an integer >= 0")
    timeout = _number("wait_timeout", raw.get("wait_timeout", DEFAULT_WAIT_TIMEOUT))
    if timeout <= 0:
        raise _invalid("wait_timeout", timeout, "seconds > 0 (WAIT 0 would block forever)")
    aof = raw.get("wait_aof", False)
    if not isinstance(aof, bool):
        raise _invalid("wait_aof", aof, "true or false")
    password = raw.get("sentinel_password")
    if password is not None and not isinstance(password, str):
        raise InvalidConfigError(
            key="backend_options.sentinel_password",
            source="redis backend_options",
            expected="a string",
            value_display="(hidden)",
        )
    return replicas, timeout, aof, password or None
