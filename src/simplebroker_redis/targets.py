"""The one grammar of connection targets: parsing, the accepted forms, redaction.

Every entry point reads a target through :func:`parse_target`: the plugin
(``.broker.toml``, ``BROKER_BACKEND_TARGET``), the runners, the Taskiq
classes, the Celery transport and result backend. Accepted forms::

    redis://[[user]:password@]host[:port][/db][?options]       (rediss:// for TLS)
    unix://[[user]:password@]/path/to/socket[?db=N&options]
    redis+cluster://[[user]:password@]host:port[,host:port...][?options]
    redis+sentinel://[[user]:password@]host:port[,host:port...]/service[/db][?options]

(``rediss+cluster://``, ``rediss+sentinel://`` for TLS to the data nodes;
``valkey`` may stand for ``redis`` in every scheme.) Anything else is an
:class:`InvalidTarget` naming the fault and showing these forms: no host
is ever filled in by default, so a typo like ``redis:/127.0.0.1:6379/0``
cannot reach another server.

Whatever precedes the last ``@`` of a target may be a password: no message,
log line or ``repr`` shows it (:func:`redact_target`).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
from dataclasses import dataclass
from typing import Final, Literal
from urllib.parse import quote, unquote, unquote_plus, urlsplit, urlunsplit

from .target_query import hide_secret_values, option_check

TopologyKind = Literal["single", "cluster", "sentinel"]

#: Schemes of one server, mapped to redis-py's.
_SINGLE: Final[dict[str, str]] = {
    "redis": "redis",
    "rediss": "rediss",
    "unix": "unix",
    "valkey": "redis",
    "valkeys": "rediss",
}

#: Topology schemes: scheme -> (kind, scheme of the data nodes).
_TOPOLOGY: Final[dict[str, tuple[TopologyKind, str]]] = {
    f"{base}+{kind}": (kind, _SINGLE[base])
    for base in ("redis", "rediss", "valkey", "valkeys")
    for kind in ("cluster", "sentinel")
}

#: Port of a single server whose URL names none (redis-py's default).
DEFAULT_PORT: Final[int] = 6379

#: The accepted forms, as every refusal shows them.
ACCEPTED_FORMS: Final[str] = (
    "redis://[[user]:password@]host[:port][/db] (rediss:// for TLS), "
    "unix://[[user]:password@]/path/to/socket[?db=N], "
    "redis+cluster://[[user]:password@]host:port[,host:port...], "
    "redis+sentinel://[[user]:password@]host:port[,host:port...]/service[/db]"
)

_ENCODE_HINT: Final[str] = (
    "percent-encode '@', ':', '/', '?' and '#' in a user name or password (%40, %3A, %2F, %3F, %23)"
)

_HOST_RE: Final = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]*[A-Za-z0-9_])?\Z")
_SCHEME_RE: Final = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")
_CONTROL_RE: Final = re.compile(r"[\x00-\x1f\x7f]")
_DB_DIGITS: Final[int] = 10


class InvalidTarget(ValueError):
    """A target outside the grammar; the message names the fault and shows the accepted forms.

    The message never contains what precedes the target's last ``@``
    (where a password would be).
    """


@dataclass(frozen=True, slots=True)
class TargetSpec:
    """A parsed target: its topology, the addresses to start from, credentials, db."""

    kind: TopologyKind
    #: the normalized target (with its password; never shown: the repr leaves it out)
    url: str = dataclasses.field(repr=False)
    scheme: str  #: scheme of the data nodes: redis, rediss or unix
    #: the server (single, TCP), the cluster seeds or the sentinels; empty for unix://
    hosts: tuple[tuple[str, int], ...]
    username: str | None
    password: str | None = dataclasses.field(repr=False)
    db: int
    service: str | None  #: the sentinel service name
    query: str  #: URL query (TLS options) passed on to every data-node connection
    socket_path: str | None = None  #: unix:// only

    def node_url(self, host: str, port: int) -> str:
        """Return a single-server URL for a data node at ``host:port`` (same credentials)."""
        netloc = _netloc_host(host, port)
        if self.username is not None or self.password is not None:
            user = quote(self.username or "", safe="")
            auth = f":{quote(self.password, safe='')}" if self.password is not None else ""
            netloc = f"{user}{auth}@{netloc}"
        return urlunsplit((self.scheme, netloc, f"/{self.db}", self.query, ""))


def _netloc_host(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass(slots=True)
class _Parts:
    """What the reader found, before it becomes a :class:`TargetSpec`."""

    hosts: tuple[tuple[str, int], ...] = ()
    db: int = 0
    service: str | None = None
    socket_path: str | None = None


class _Reader:
    """One pass over a target string, remembering where a password may hide."""

    def __init__(self, text: str) -> None:
        self.text = text
        match = _SCHEME_RE.match(text)
        self.scheme = match.group(1).lower() if match else ""
        self.start = match.end() if match else 0  #: first character after "scheme:"
        #: Whether "//" follows the scheme: only then is "user:password@" where a URL puts it.
        self.has_authority = bool(match) and text.startswith("//", self.start)
        if self.has_authority:
            self.start += 2
        #: text[start:secret_end] may hold a password: never shown.
        self.secret_end = max(text.rfind("@"), self.start)
        ends = [i for i in (text.find(c, self.start) for c in "/?#") if i != -1]
        self.authority_end = min(ends, default=len(text))

    # -- showing ------------------------------------------------------------------
    def shown(self, *, valid: bool = False) -> str:
        """Return the target with whatever may be a password replaced by ``***``.

        ``valid``: the target parsed, so its password is exactly the
        authority's ``user:PASSWORD@`` (an ``@`` may follow in a file path),
        and the user name is shown. Otherwise all before the last ``@`` is
        hidden: a user name there may be a password that lost its ``:``.
        """
        if valid:
            userinfo_end = self.text.rfind("@", self.start, self.authority_end)
            user, colon, _ = self.text[self.start : max(userinfo_end, self.start)].partition(":")
            if userinfo_end == -1 or not colon:
                return self.text
            return f"{self.text[: self.start]}{user}:***{self.text[userinfo_end:]}"
        if self.secret_end == self.start:
            return hide_secret_values(self.text)
        tail = hide_secret_values(self.text[self.secret_end :])
        return f"{self.text[: self.start]}***{tail}"

    def piece(self, start: int, end: int) -> str | None:
        """Return ``text[start:end]`` quoted, or None when it may be part of a password."""
        if start < self.secret_end and self.secret_end > self.start:
            return None
        return repr(self.text[start:end])

    def fault(self, why: str) -> InvalidTarget:
        """Return the error for ``why``, showing the (redacted) target and the accepted forms."""
        return InvalidTarget(
            f"invalid redis backend target {self.shown()!r}: {why}; accepted forms: "
            f"{ACCEPTED_FORMS}"
        )

    def named(self, what: str, start: int, end: int) -> str:
        """Return ``what`` followed by the piece it names, when that may be shown."""
        shown = self.piece(start, end)
        return f"{what} {shown}" if shown else f"{what} (not shown; {_ENCODE_HINT})"

    # -- reading --------------------------------------------------------------------
    def parse(self) -> TargetSpec:
        """Read the whole target, or raise :class:`InvalidTarget`."""
        kind, data_scheme = self._scheme()
        if "#" in self.text[self.start :]:
            raise self.fault(f"a '#' has no place in a target ({_ENCODE_HINT})")
        userinfo_end = self.text.rfind("@", self.start, self.authority_end)
        host_start = userinfo_end + 1 if userinfo_end != -1 else self.start
        path_end = self.text.find("?", self.authority_end)
        path_end = len(self.text) if path_end == -1 else path_end
        query = self.text[path_end + 1 :]
        options = self._query(query, path_end + 1, data_scheme)
        if data_scheme == "unix":
            parts = self._unix(host_start, path_end, options)
        elif kind == "single":
            parts = self._single(host_start, path_end)
        else:
            parts = self._topology(kind, host_start, path_end)
        username, password = self._credentials(userinfo_end)
        rest = self.text[self.start :]
        url = f"{data_scheme if kind == 'single' else self.scheme}://{rest}"
        if kind == "single":
            self._agrees_with_urlsplit(url, parts)
        return TargetSpec(
            kind, url, data_scheme, parts.hosts, username, password, parts.db,
            parts.service, query, parts.socket_path,
        )  # fmt: skip

    def _scheme(self) -> tuple[TopologyKind, str]:
        if not self.scheme:
            raise self.fault("it does not start with a scheme")
        known = _TOPOLOGY.get(self.scheme) or (
            ("single", _SINGLE[self.scheme]) if self.scheme in _SINGLE else None
        )
        slashes = self.text.startswith("//", len(self.scheme) + 1)
        if known is None:
            # A scheme is shown only when '//' follows it: "secret@host" is no scheme.
            shown = f" {self.scheme!r}" if slashes else ""
            hint = (
                "; Celery takes simplebroker+redis://..., the backend the part after "
                "'simplebroker+'"
                if self.scheme.startswith("simplebroker")
                else ""
            )
            raise self.fault(f"unknown scheme{shown}{hint}")
        if not slashes:
            example = "unix:///path/to/socket" if self.scheme == "unix" else "redis://host:port/db"
            raise self.fault(f"'{self.scheme}:' must be followed by '//' (as in {example})")
        if _CONTROL_RE.search(self.text):
            raise self.fault("it contains a control character (a tab or line break?)")
        return known

    def _credentials(self, userinfo_end: int) -> tuple[str | None, str | None]:
        if userinfo_end == -1:
            return None, None
        user, colon, secret = self.text[self.start : userinfo_end].partition(":")
        return unquote(user) or None, (unquote(secret) or None) if colon else None

    def _agrees_with_urlsplit(self, url: str, parts: _Parts) -> None:
        """Refuse a target that redis-py (``urlsplit``) would read differently from us."""
        try:
            split = urlsplit(url)
            port = split.port
        except ValueError:
            # urlsplit's own message may quote the password: not shown.
            raise self.fault(f"the URL is malformed ({_ENCODE_HINT})") from None
        if parts.socket_path is None:
            host = parts.hosts[0]
            if (split.hostname, port or DEFAULT_PORT) != host:
                raise self.fault(f"the host part is ambiguous ({_ENCODE_HINT})")

    def _single(self, host_start: int, path_end: int) -> _Parts:
        if host_start == self.authority_end:
            raise self.fault("no host (redis://host:port/db)")
        if "," in self.text[host_start : self.authority_end]:
            raise self.fault(
                "several hosts need redis+cluster:// (seed nodes) or redis+sentinel:// (sentinels)"
            )
        host = self._address(host_start, self.authority_end, DEFAULT_PORT)
        segments = self._segments(path_end)
        if len(segments) > 1:
            raise self.fault(self.named("unexpected path", self.authority_end, path_end))
        return _Parts(hosts=(host,), db=self._db(segments, path_end))

    def _unix(self, host_start: int, path_end: int, options: dict[str, str]) -> _Parts:
        if host_start != self.authority_end:
            raise self.fault(
                "unix:// takes no host: unix:///path/to/socket (three slashes) or "
                "unix://:password@/path/to/socket"
            )
        raw = self.text[self.authority_end : path_end]
        if "@" in raw:
            raise self.fault(f"an '@' after the user:password part ({_ENCODE_HINT})")
        path = unquote(raw)
        if not path.startswith("/") or path.rstrip("/") == "":
            raise self.fault("no socket path (unix:///path/to/socket)")
        return _Parts(socket_path=path, db=int(options.get("db", "0")))

    def _topology(self, kind: TopologyKind, host_start: int, path_end: int) -> _Parts:
        if host_start == self.authority_end:
            what = "seed node" if kind == "cluster" else "sentinel"
            raise self.fault(f"no {what} host:port given")
        hosts: list[tuple[str, int]] = []
        at = host_start
        for item in self.text[host_start : self.authority_end].split(","):
            if not item:
                raise self.fault("an empty entry in the list of hosts")
            hosts.append(self._address(at, at + len(item), None))
            at += len(item) + 1
        segments = self._segments(path_end)
        service = None
        if kind == "sentinel":
            if not segments:
                raise self.fault(
                    "name the sentinel service: redis+sentinel://host:port/SERVICE[/db]"
                )
            service, segments = unquote(segments[0]), segments[1:]
        if len(segments) > 1:
            raise self.fault(self.named("unexpected path", self.authority_end, path_end))
        db = self._db(segments, path_end)
        if kind == "cluster" and db != 0:
            raise self.fault("a Redis Cluster has only db 0")
        return _Parts(hosts=tuple(hosts), db=db, service=service)

    def _segments(self, path_end: int) -> list[str]:
        path = self.text[self.authority_end : path_end]
        if "//" in path or "@" in path:
            raise self.fault(self.named("unexpected path", self.authority_end, path_end))
        return [segment for segment in path.split("/") if segment]

    def _db(self, segments: list[str], path_end: int) -> int:
        if not segments:
            return 0
        db = segments[0]
        if not db.isdigit() or len(db) > _DB_DIGITS:
            start = self.text.rfind(db, self.authority_end, path_end)
            raise self.fault(
                self.named("the path must be a db number, not", start, start + len(db))
            )
        return int(db)

    def _address(self, start: int, end: int, default_port: int | None) -> tuple[str, int]:
        item = self.text[start:end]
        if item.startswith("["):
            host, rest = self._bracketed(item, start, end)
        else:
            host, colon, port_text = item.partition(":")
            rest = colon + port_text
            hint = " (an IPv6 address goes in brackets: [::1]:6379)" if ":" in port_text else ""
            if not host:
                raise self.fault(self.named("empty host in", start, end) + hint)
            if not _HOST_RE.match(host):
                raise self.fault(self.named("not a host name or address:", start, end) + hint)
            host = host.lower()
        if not rest and default_port is not None:
            return host, default_port
        if not rest:
            raise self.fault(self.named("needs a port (host:port):", start, end))
        port_text = rest[1:]
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise self.fault(self.named("the port must be a number 1-65535 in", start, end))
        return host, int(port_text)

    def _bracketed(self, item: str, start: int, end: int) -> tuple[str, str]:
        """Return the IPv6 address of ``[address]:port`` and the text after the bracket."""
        host, bracket, rest = item[1:].partition("]")
        address = unquote(host).partition("%")[0]
        try:
            ipaddress.IPv6Address(address)
        except ValueError:
            bracket = ""
        if not bracket or (rest and not rest.startswith(":")):
            raise self.fault(self.named("not an [IPv6 address]:port:", start, end))
        return unquote(host).lower(), rest

    def _query(self, query: str, offset: int, data_scheme: str) -> dict[str, str]:
        """Check every ``name=value`` of ``query``; return them decoded (redis-py reads them so)."""
        options: dict[str, str] = {}
        if not query:
            return options
        for item in query.split("&"):
            end = offset + len(item)
            name, value = self._option(item, offset, end, data_scheme)
            if name in options:
                raise self.fault(f"option {name!r} given twice")
            options[name] = value
            offset = end + 1
        return options

    def _option(self, item: str, start: int, end: int, data_scheme: str) -> tuple[str, str]:
        raw_name, equals, raw_value = item.partition("=")
        name, value = unquote_plus(raw_name), unquote_plus(raw_value)
        check = option_check(name, data_scheme)
        if isinstance(check, str):
            raise self.fault(self.named(check, start, start + len(raw_name)))
        if not equals or not value:
            raise self.fault(f"option {name!r} has no value ({name}=...)")
        expected = check(value)
        if expected is not None:
            raise self.fault(self.named(f"option {name!r} must be {expected}, not", start, end))
        return name, value


def parse_target(target: str) -> TargetSpec:
    """Parse any accepted target into a :class:`TargetSpec`, or raise :class:`InvalidTarget`."""
    if not isinstance(target, str):
        raise InvalidTarget(
            f"redis backend target must be a string, not {type(target).__name__}; "
            f"accepted forms: {ACCEPTED_FORMS}"
        )
    if not target.strip():
        raise InvalidTarget(f"redis backend target is empty; accepted forms: {ACCEPTED_FORMS}")
    return _Reader(target.strip()).parse()


def redact_target(target: str) -> str:
    """Return ``target`` with any password (whatever precedes its last ``@``) shown as ``***``.

    A valid target shows its user name and everything after the password; an
    invalid one hides all that precedes its last ``@``.
    """
    reader = _Reader(target)
    try:
        reader.parse()
    except InvalidTarget:
        return reader.shown()
    return reader.shown(valid=True)


def normalize_target(target: str) -> str:
    """Return ``target`` with a redis-py scheme (topologies kept); reject anything else clearly."""
    return parse_target(target).url


def target_has_password(target: str) -> bool:
    """Return whether the URL itself carries a password."""
    try:
        return parse_target(target).password is not None
    except InvalidTarget:
        return False
