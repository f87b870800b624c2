"""The provider's ``[brokers.<name>]`` settings: read, checked, defaulted.

Protean hands a broker its configuration table as ``conn_info``::

    [brokers.default]
    provider = "simplebroker"
    URI = "redis://127.0.0.1:6379/0"     # or a SQLite file: "/var/lib/app/broker.db"
    NAMESPACE = "myapp"                  # Redis only

``URI`` picks the backend: a ``sqlite:`` URL or a plain path is a SQLite
file (SimpleBroker's built-in backend); anything else is a Redis target,
read by the redis backend's own parser (``redis://``, ``rediss://``,
``unix://``, ``redis+cluster://``, ``redis+sentinel://``). Keys are
case-insensitive. A missing or malformed value raises Protean's
``ConfigurationError`` naming the key before anything connects; the URI's
password never appears in it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from protean.exceptions import ConfigurationError
from simplebroker.ext import InvalidConfigError

from simplebroker_redis import DEFAULT_NAMESPACE, BackendOptions
from simplebroker_redis.calls import DEFAULT_DEDUPE_SECONDS
from simplebroker_redis.lease_timing import LeaseTiming, TimingError, lease_timing
from simplebroker_redis.options import OPTION_NAMES
from simplebroker_redis.targets import parse_target, redact_target

from .names import validate_prefix

#: Default first component of every queue name.
DEFAULT_PREFIX: Final[str] = "protean"

#: Deliveries after which a message goes to its group's dead-letter queue.
DEFAULT_MAX_DELIVERIES: Final[int] = 5

#: Most log entries one consumer copies into its group per round.
DEFAULT_COPY_BATCH: Final[int] = 100

Backend = Literal["redis", "sqlite"]

#: Keys Protean or its docs put in every broker table; they mean nothing here.
_IGNORED: Final[frozenset[str]] = frozenset({"PROVIDER", "IS_ASYNC", "TTL"})

#: The provider's own keys.
_OWN: Final[frozenset[str]] = frozenset(
    {
        "URI",
        "NAMESPACE",
        "QUEUE_PREFIX",
        "LEASE_SECONDS",
        "HEARTBEAT_SECONDS",
        "RECOVER_SECONDS",
        "MAX_DELIVERIES",
        "COPY_BATCH",
        "TASK_INDEX",
        "TASK_STATS",
        "DEDUPE_SECONDS",
    }
)

#: Redis ``[backend_options]`` accepted as keys of the table (NAMESPACE is own).
_BACKEND_KEYS: Final[dict[str, str]] = {
    name.upper(): name for name in OPTION_NAMES if name != "namespace"
}


@dataclass(frozen=True, slots=True)
class Settings:
    """Validated settings of one broker."""

    backend: Backend
    target: str = field(repr=False)  #: a Redis target URL, or an absolute SQLite path
    shown: str  #: ``target`` with any password replaced by ``***``
    prefix: str = DEFAULT_PREFIX
    namespace: str = DEFAULT_NAMESPACE
    backend_options: dict[str, Any] = field(default_factory=dict, repr=False)
    #: LEASE_SECONDS, HEARTBEAT_SECONDS (Redis) and RECOVER_SECONDS
    timing: LeaseTiming = field(default_factory=LeaseTiming)
    max_deliveries: int | None = DEFAULT_MAX_DELIVERIES
    copy_batch: int = DEFAULT_COPY_BATCH
    #: TASK_INDEX, TASK_STATS (Redis): None leaves them to the environment's rule
    #: (``simplebroker_redis.tasks.enabled``); on by default.
    task_index: bool | None = None
    task_stats: bool | None = None
    #: Redis: seconds a published message's ID keeps a resend from storing it twice.
    dedupe_seconds: float = DEFAULT_DEDUPE_SECONDS


def _switch(raw: Mapping[str, Any], key: str) -> bool | None:
    value = raw.get(key)
    if value is not None and not isinstance(value, bool):
        raise _bad(key, f"must be true or false, not {value!r}")
    return value


def _bad(key: str, why: str) -> ConfigurationError:
    return ConfigurationError(f"simplebroker broker: {key} {why}")


def _timing(raw: Mapping[str, Any]) -> LeaseTiming:
    names = ("LEASE_SECONDS", "HEARTBEAT_SECONDS", "RECOVER_SECONDS")
    try:
        return lease_timing(*(raw.get(name) for name in names), names=names)
    except TimingError as exc:
        raise _bad(exc.name, f"must be {exc.problem}, not {exc.value!r}") from None


def _max_deliveries(raw: Mapping[str, Any]) -> int | None:
    value = raw.get("MAX_DELIVERIES", DEFAULT_MAX_DELIVERIES)
    if value is None or value is False or value == 0:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _bad("MAX_DELIVERIES", f"must be an integer >= 1 (0: never), not {value!r}")
    return value


def _dedupe_seconds(raw: Mapping[str, Any]) -> float:
    value = raw.get("DEDUPE_SECONDS", DEFAULT_DEDUPE_SECONDS)
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0.001:
        raise _bad("DEDUPE_SECONDS", f"must be a number of seconds >= 0.001, not {value!r}")
    return float(value)


def _sqlite_path(uri: str) -> str:
    """Return the absolute file path a SQLite URI or plain path names."""
    text = uri
    if uri.lower().startswith("sqlite:"):
        # SQLAlchemy's form, which Protean's database URIs use: three slashes
        # then a relative path, four for an absolute one.
        text = uri[len("sqlite:") :]
        if not text.startswith("///"):
            raise _bad(
                "URI", "of a SQLite file must look like sqlite:///relative.db or sqlite:////abs.db"
            )
        text = text[3:]
    if not text or text == ":memory:" or text.startswith("file:"):
        raise _bad("URI", "must name a SQLite file that every process can open")
    return str(Path(text).expanduser().absolute())


def _target(uri: object) -> tuple[Backend, str, str]:
    if not isinstance(uri, str) or not uri.strip():
        raise _bad("URI", "is required: a redis://... target or a SQLite file path")
    uri = uri.strip()
    if uri.lower().startswith("sqlite:") or "://" not in uri:
        path = _sqlite_path(uri)
        return "sqlite", path, path
    try:
        parse_target(uri)
    except ValueError as exc:  # the backend's message, password already redacted
        raise _bad("URI", f"is not a target the redis backend takes: {exc}") from None
    return "redis", uri, redact_target(uri)


def _backend_options(raw: Mapping[str, Any], namespace: object) -> dict[str, Any]:
    options = {_BACKEND_KEYS[key]: value for key, value in raw.items() if key in _BACKEND_KEYS}
    options["namespace"] = namespace
    try:
        return BackendOptions.parse(options).to_dict()
    except InvalidConfigError as exc:
        raise _bad("table", f"has an invalid backend option: {exc}") from None


def parse(conn_info: Mapping[str, Any]) -> Settings:
    """Return the settings of ``conn_info`` (Protean's broker table); raise clearly."""
    raw = {str(key).upper(): value for key, value in conn_info.items()}
    unknown = sorted(set(raw) - _OWN - _IGNORED - set(_BACKEND_KEYS))
    if unknown:
        known = ", ".join(sorted(_OWN | set(_BACKEND_KEYS)))
        raise _bad("table", f"has unknown key(s) {', '.join(unknown)} (known: {known})")
    backend, target, shown = _target(raw.get("URI"))
    try:
        prefix = validate_prefix(raw.get("QUEUE_PREFIX", DEFAULT_PREFIX))
    except ValueError as exc:
        raise _bad("QUEUE_PREFIX", str(exc)) from None
    namespace = raw.get("NAMESPACE", DEFAULT_NAMESPACE)
    if backend == "sqlite":
        redis_only = sorted({"NAMESPACE", *_BACKEND_KEYS} & set(raw))
        if redis_only:
            raise _bad("table", f"sets {', '.join(redis_only)}, which only a Redis URI takes")
        options: dict[str, Any] = {}
    else:
        options = _backend_options(raw, namespace)
    batch = raw.get("COPY_BATCH", DEFAULT_COPY_BATCH)
    if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= 10_000:
        raise _bad("COPY_BATCH", f"must be an integer from 1 to 10000, not {batch!r}")
    return Settings(
        backend=backend,
        target=target,
        shown=shown,
        prefix=prefix,
        namespace=str(options.get("namespace", DEFAULT_NAMESPACE)),
        backend_options=options,
        timing=_timing(raw),
        max_deliveries=_max_deliveries(raw),
        copy_batch=batch,
        task_index=_switch(raw, "TASK_INDEX"),
        task_stats=_switch(raw, "TASK_STATS"),
        dedupe_seconds=_dedupe_seconds(raw),
    )
