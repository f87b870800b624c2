"""Backend options and connection targets: parsing, validation, redaction.

A target is a ``redis://``, ``rediss://`` (TLS) or ``unix://`` URL (``valkey``
schemes are accepted as aliases), or a topology:

- ``redis+cluster://[user:password@]host:port[,host:port...]`` (seed nodes
  of a Redis Cluster; ``rediss+cluster://`` for TLS);
- ``redis+sentinel://[user:password@]host:port[,host:port...]/service[/db]``
  (the sentinels; the password is the data nodes'; ``rediss+sentinel://``
  for TLS to the data nodes).

:func:`parse_target` reads any of them into a :class:`TargetSpec`. The
password comes from the URL or, when the URL has none, from
``BROKER_BACKEND_PASSWORD``. Passwords never reach an error message, a log
line or a ``repr``: everything shown goes through :func:`redact_target`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, TypedDict
from urllib.parse import quote, unquote, urlsplit, urlunsplit

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

TopologyKind = Literal["single", "cluster", "sentinel"]

#: Topology schemes: scheme -> (kind, scheme of the data nodes).
_TOPOLOGY_SCHEMES: Final[dict[str, tuple[TopologyKind, str]]] = {
    "redis+cluster": ("cluster", "redis"),
    "rediss+cluster": ("cluster", "rediss"),
    "valkey+cluster": ("cluster", "redis"),
    "valkeys+cluster": ("cluster", "rediss"),
    "redis+sentinel": ("sentinel", "redis"),
    "rediss+sentinel": ("sentinel", "rediss"),
    "valkey+sentinel": ("sentinel", "redis"),
    "valkeys+sentinel": ("sentinel", "rediss"),
}

_TARGET_FORMS: Final[str] = (
    "a redis://, rediss://, unix://, redis+cluster://host:port[,host:port...] or "
    "redis+sentinel://host:port[,host:port...]/service[/db] URL"
)

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


@dataclass(frozen=True, slots=True)
class TargetSpec:
    """A parsed target: its topology, the addresses to start from, credentials, db."""

    kind: TopologyKind
    url: str  #: the normalized target (with its password; never shown)
    scheme: str  #: scheme of the data nodes: redis, rediss or unix
    hosts: tuple[tuple[str, int], ...]  #: cluster seeds or sentinels (empty for single)
    username: str | None
    password: str | None = dataclasses.field(repr=False)
    db: int
    service: str | None  #: the sentinel service name
    query: str  #: URL query (TLS options) passed on to every data-node connection

    def node_url(self, host: str, port: int) -> str:
        """Return a single-server URL for a data node at ``host:port`` (same credentials)."""
        netloc = _netloc_host(host, port)
        if self.username is not None or self.password is not None:
            user = _quote(self.username or "")
            auth = f":{_quote(self.password)}" if self.password is not None else ""
            netloc = f"{user}{auth}@{netloc}"
        return urlunsplit((self.scheme, netloc, f"/{self.db}", self.query, ""))


def _quote(text: str) -> str:
    return quote(text, safe="")


def _netloc_host(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _bad(target: str, why: str) -> ValueError:
    return ValueError(f"invalid redis backend target {redact_target(target)!r}: {why}")


def _parse_hosts(target: str, hostlist: str) -> tuple[tuple[str, int], ...]:
    hosts: list[tuple[str, int]] = []
    for item in hostlist.split(","):
        item = item.strip()
        if item.startswith("["):  # [ipv6]:port
            host, _, rest = item[1:].partition("]")
            port_text = rest.removeprefix(":")
        else:
            host, _, port_text = item.rpartition(":")
            if not host:
                host, port_text = item, ""
        if not host:
            raise _bad(target, f"empty host in {hostlist!r}")
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise _bad(target, f"{item!r} needs a port (host:port)")
        hosts.append((host, int(port_text)))
    return tuple(hosts)


def parse_target(target: str) -> TargetSpec:
    """Parse any accepted target into a :class:`TargetSpec`; errors name what is wrong."""
    if not isinstance(target, str) or not target.strip():
        raise ValueError(f"redis backend target must be {_TARGET_FORMS}")
    text = target.strip()
    scheme_text, sep, rest = text.partition("://")
    topology = _TOPOLOGY_SCHEMES.get(scheme_text.lower()) if sep else None
    if topology is None:
        try:
            parts = urlsplit(text)
        except ValueError as exc:
            raise _bad(target, str(exc)) from None
        scheme = _SCHEMES.get(parts.scheme.lower())
        if scheme is None:
            raise _bad(target, f"use {_TARGET_FORMS}")
        # urlunsplit would drop the "//" of a unix:// URL (it has no host),
        # and redis-py reads "unix:/path" as no scheme at all.
        url = f"{scheme}://{rest}" if sep else urlunsplit((scheme, *parts[1:]))
        return TargetSpec(
            "single", url, scheme, (), parts.username, parts.password, 0, None, parts.query
        )
    return _parse_topology(target, scheme_text.lower(), rest, *topology)


def _parse_topology(
    target: str, scheme_text: str, rest: str, kind: TopologyKind, scheme: str
) -> TargetSpec:
    # The query first: its values may hold "/" (ssl_ca_certs=/etc/ca.pem), and a
    # cluster target has no path before it ("host:port,host:port?ssl_...").
    location, _, query = rest.partition("?")
    netloc, _, path = location.partition("/")
    userinfo, at, hostlist = netloc.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
    if not hostlist:
        raise _bad(target, f"no {'seed node' if kind == 'cluster' else 'sentinel'} host:port given")
    hosts = _parse_hosts(target, hostlist)
    segments = [s for s in path.split("/") if s]
    service = None
    if kind == "sentinel":
        if not segments:
            raise _bad(target, "name the sentinel service: redis+sentinel://host:port/SERVICE[/db]")
        service, segments = unquote(segments[0]), segments[1:]
    if len(segments) > 1 or (segments and not segments[0].isdigit()):
        raise _bad(target, f"unexpected path {path!r} (only a db number may follow)")
    db = int(segments[0]) if segments else 0
    if kind == "cluster" and db != 0:
        raise _bad(target, "a Redis Cluster has only db 0")
    url = f"{scheme_text}://{rest}"
    return TargetSpec(kind, url, scheme, hosts, username, password, db, service, query)


def normalize_target(target: str) -> str:
    """Return ``target`` with a redis-py scheme (topologies kept); reject anything else clearly."""
    return parse_target(target).url


def target_has_password(target: str) -> bool:
    """Return whether the URL itself carries a password."""
    try:
        return parse_target(target).password is not None
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
