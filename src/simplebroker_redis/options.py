"""Backend options and connection targets: parsing, validation, redaction.

A target is a ``redis://``, ``rediss://`` (TLS) or ``unix://`` URL (``valkey``
schemes are accepted as aliases). The password comes from the URL or, when
the URL has none, from ``BROKER_BACKEND_PASSWORD``. Passwords never reach an
error message, a log line or a ``repr``: everything shown goes through
:func:`redact_target`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, TypedDict
from urllib.parse import urlsplit, urlunsplit

from simplebroker.ext import InvalidConfigError

from .keys import DEFAULT_NAMESPACE, validate_namespace

#: Connections a runner's pool may open.
DEFAULT_MAX_CONNECTIONS: Final[int] = 50

#: Seconds before an at-least-once batch counts as stale (negative: never).
DEFAULT_STALE_BATCH_SECONDS: Final[float] = 300.0

#: Schemes accepted in targets, mapped to what redis-py understands.
_SCHEMES: Final[dict[str, str]] = {
    "redis": "redis",
    "rediss": "rediss",
    "unix": "unix",
    "valkey": "redis",
    "valkeys": "rediss",
}

#: How scripts run on the server: one Functions library (FCALL), or EVALSHA.
SCRIPTING_MODES: Final[tuple[str, ...]] = ("functions", "eval")

_OPTION_NAMES: Final[tuple[str, ...]] = (
    "namespace",
    "max_connections",
    "pool_timeout",
    "stale_batch_seconds",
    "scripting",
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
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _invalid(name, value, "a number")
    if not math.isfinite(value):
        raise _invalid(name, value, "a finite number")
    return float(value)


class OptionKwargs(TypedDict, total=False):
    """The backend options as keyword arguments (``RedisRunner(url, namespace=...)``)."""

    namespace: str
    max_connections: int
    pool_timeout: float | None
    stale_batch_seconds: float
    scripting: str


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

    @classmethod
    def parse(cls, options: Mapping[str, Any] | None) -> BackendOptions:
        """Validate a raw option mapping; unknown names and bad types raise."""
        raw = dict(options or {})
        for name in raw:
            if name not in _OPTION_NAMES:
                raise InvalidConfigError(
                    key=f"backend_options.{name}",
                    source="redis backend_options",
                    expected="one of " + ", ".join(_OPTION_NAMES),
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
        return cls(namespace, max_connections, pool_timeout, stale, scripting)

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
        return out

    def stale_batch_ns(self) -> int | None:
        """Return the stale-batch lease in integer nanoseconds (None: never)."""
        if self.stale_batch_seconds < 0:
            return None
        return round(self.stale_batch_seconds * 1_000_000_000)


def normalize_target(target: str) -> str:
    """Return ``target`` with a redis-py scheme; reject anything else clearly."""
    if not isinstance(target, str) or not target.strip():
        raise ValueError("redis backend target must be a redis://, rediss:// or unix:// URL")
    try:
        parts = urlsplit(target.strip())
    except ValueError as exc:
        raise ValueError(f"invalid redis backend target {redact_target(target)!r}: {exc}") from None
    scheme = _SCHEMES.get(parts.scheme.lower())
    if scheme is None:
        raise ValueError(
            f"invalid redis backend target {redact_target(target)!r}: use a "
            "redis://, rediss:// or unix:// URL"
        )
    return urlunsplit((scheme, *parts[1:]))


def target_has_password(target: str) -> bool:
    """Return whether the URL itself carries a password."""
    try:
        return urlsplit(target).password is not None
    except ValueError:
        return False


def redact_target(target: str) -> str:
    """Return ``target`` with any password replaced by ``***``."""
    try:
        parts = urlsplit(target)
    except ValueError:
        parts = None
    if parts is not None and parts.password is not None:
        user = parts.username or ""
        host = parts.netloc.rpartition("@")[2]
        return urlunsplit((parts.scheme, f"{user}:***@{host}", *parts[2:]))
    at = target.rfind("@")
    scheme_end = target.find("://")
    if at != -1 and scheme_end != -1 and scheme_end < at:
        # Malformed URLs: hide the whole userinfo rather than guess.
        return f"{target[: scheme_end + 3]}***{target[at:]}"
    return target
