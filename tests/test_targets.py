"""The target grammar: every valid form parses exactly, every mutation is read or refused.

Hypothesis builds valid targets of every form (``redis://``, ``rediss://``,
``unix://``, ``redis+cluster://``, ``redis+sentinel://``, with users,
passwords, dbs and query options), then mutates them at random. A target
is either parsed exactly (and redis-py reads the URL it is handed the same
way: no host, port or db filled in behind the user's back) or refused with
:class:`InvalidTarget` naming the accepted forms, without the password.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import pytest
import redis
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from simplebroker_redis import targets
from simplebroker_redis.targets import (
    ACCEPTED_FORMS,
    InvalidTarget,
    TargetSpec,
    parse_target,
    redact_target,
)

# The grammar's property tests parse strings only: no server at all.
pytestmark = pytest.mark.once

PROPERTIES = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])

#: Everything the parser's messages may say by themselves (a password piece may match it).
WORDING = Path(targets.__file__).read_text(encoding="utf-8")

#: Characters a mutation inserts: every delimiter of the grammar, and ordinary ones.
MUTATION_CHARS = ":/@?#&=,[]% +.-_aZ09\t"


@dataclass
class Built:
    """A valid target and what it must parse into."""

    url: str
    kind: str
    scheme: str  #: of the data nodes
    hosts: tuple[tuple[str, int], ...]
    username: str | None
    password: str | None
    db: int
    service: str | None = None
    socket_path: str | None = None
    options: dict[str, str] = field(default_factory=dict)


hostnames = st.one_of(
    st.from_regex(r"[a-z][a-z0-9-]{0,10}[a-z0-9](\.[a-z][a-z0-9]{0,6}){0,2}", fullmatch=True),
    st.tuples(*[st.integers(0, 255)] * 4).map(lambda t: ".".join(map(str, t))),
    st.sampled_from(["::1", "fe80::1", "2001:db8::7"]),
)
ports = st.integers(1, 65535)
users = st.one_of(st.none(), st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True))
# Distinctive passwords (a "Pw" prefix) with every troublesome character, percent-encoded.
passwords = st.one_of(
    st.none(),
    st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=6, max_size=14).map(
        lambda text: "Pw" + text
    ),
)
plain_options = st.dictionaries(
    st.sampled_from(
        ["socket_timeout", "socket_connect_timeout", "socket_keepalive", "client_name"]
    ),
    st.sampled_from(["5", "0.5", "true", "worker7"]),
    max_size=2,
).filter(lambda opts: all(_option_ok(name, value) for name, value in opts.items()))
tls_options = st.dictionaries(
    st.sampled_from(["ssl_ca_certs", "ssl_cert_reqs", "ssl_check_hostname", "socket_timeout"]),
    st.sampled_from(["/etc/ssl/ca.pem", "required", "none", "false", "3"]),
    max_size=3,
).filter(lambda opts: all(_option_ok(name, value) for name, value in opts.items()))


def _option_ok(name: str, value: str) -> bool:
    valid = {
        "socket_timeout": {"5", "0.5", "3"},
        "socket_connect_timeout": {"5", "0.5", "3"},
        "socket_keepalive": {"true", "false"},
        "client_name": {"worker7"},
        "ssl_ca_certs": {"/etc/ssl/ca.pem"},
        "ssl_cert_reqs": {"required", "none"},
        "ssl_check_hostname": {"true", "false"},
    }
    return value in valid[name]


def _userinfo(username: str | None, password: str | None) -> str:
    if username is None and password is None:
        return ""
    secret = f":{quote(password, safe='')}" if password is not None else ""
    return f"{username or ''}{secret}@"


def _netloc(host: str, port: int | None) -> str:
    shown = f"[{host}]" if ":" in host else host
    return shown if port is None else f"{shown}:{port}"


def _query(options: dict[str, str]) -> str:
    return "?" + "&".join(f"{k}={v}" for k, v in options.items()) if options else ""


@st.composite
def singles(draw: st.DrawFn) -> Built:
    tls = draw(st.booleans())
    scheme = "rediss" if tls else "redis"
    host, port = draw(hostnames), draw(st.one_of(st.none(), ports))
    user, password = draw(users), draw(passwords)
    db = draw(st.one_of(st.none(), st.integers(0, 15)))
    options = draw(tls_options if tls else plain_options)
    path = "" if db is None else f"/{db}"
    url = f"{scheme}://{_userinfo(user, password)}{_netloc(host, port)}{path}{_query(options)}"
    return Built(url, "single", scheme, ((host, port or 6379),), user, password, db or 0,
                 options=options)  # fmt: skip


@st.composite
def unix_sockets(draw: st.DrawFn) -> Built:
    path = draw(st.from_regex(r"(/[a-z0-9_.-]{1,8}){1,3}", fullmatch=True))
    user, password = draw(users), draw(passwords)
    db = draw(st.one_of(st.none(), st.integers(0, 15)))
    options = {} if db is None else {"db": str(db)}
    url = f"unix://{_userinfo(user, password)}{path}{_query(options)}"
    return Built(url, "single", "unix", (), user, password, db or 0, socket_path=path,
                 options=options)  # fmt: skip


@st.composite
def topologies(draw: st.DrawFn) -> Built:
    kind = draw(st.sampled_from(["cluster", "sentinel"]))
    tls = draw(st.booleans())
    scheme = f"{'rediss' if tls else 'redis'}+{kind}"
    hosts = tuple(draw(st.lists(st.tuples(hostnames, ports), min_size=1, max_size=3)))
    user, password = draw(users), draw(passwords)
    options = draw(tls_options if tls else plain_options)
    netloc = ",".join(_netloc(h, p) for h, p in hosts)
    service, db, path = None, 0, ""
    if kind == "sentinel":
        service = draw(st.from_regex(r"[a-z][a-z0-9_-]{0,10}", fullmatch=True))
        db = draw(st.integers(0, 15))
        path = f"/{service}/{db}"
    elif draw(st.booleans()):
        path = "/0"
    url = f"{scheme}://{_userinfo(user, password)}{netloc}{path}{_query(options)}"
    return Built(url, kind, "rediss" if tls else "redis", hosts, user, password, db,
                 service=service, options=options)  # fmt: skip


targets = st.one_of(singles(), unix_sockets(), topologies())


@st.composite
def mutated(draw: st.DrawFn) -> tuple[Built, str]:
    built = draw(targets)
    text = built.url
    for _ in range(draw(st.integers(1, 3))):
        # At a delimiter, or anywhere (hypothesis alone favours position 0).
        delimiters = [i for i, char in enumerate(text) if char in "/:@?&=,[]." and i > 6]
        anywhere = st.integers(0, len(text))
        at = draw(st.one_of(st.sampled_from(delimiters), anywhere) if delimiters else anywhere)
        action = draw(st.sampled_from(["delete", "replace", "insert", "double"]))
        char = draw(st.sampled_from(MUTATION_CHARS))
        if action == "insert":
            text = text[:at] + char + text[at:]
        elif action == "delete":
            text = text[:at] + text[at + 1 :]
        elif action == "replace":
            text = text[:at] + char + text[at + 1 :]
        else:
            text = text[:at] + text[at : at + 1] * 2 + text[at + 1 :]
    return built, text


def _check_exact(spec: TargetSpec, built: Built) -> None:
    assert spec.kind == built.kind
    assert spec.scheme == built.scheme
    assert spec.hosts == tuple((host.lower(), port) for host, port in built.hosts)
    assert (spec.username, spec.password) == (built.username, built.password)
    assert spec.db == built.db
    assert spec.service == built.service
    assert spec.socket_path == built.socket_path


def _redis_py_agrees(spec: TargetSpec) -> None:
    """redis-py, handed the URL (or a data node's URL), reads what the spec says."""
    url = spec.url if spec.kind == "single" else spec.node_url(*spec.hosts[0])
    parsed = redis.connection.parse_url(url)
    assert parsed.get("username") == spec.username
    assert parsed.get("password") == spec.password
    assert parsed.get("db", 0) == spec.db
    if spec.socket_path is not None:
        assert parsed["path"] == spec.socket_path
    else:
        host, port = spec.hosts[0]
        assert (parsed["host"], parsed.get("port", 6379)) == (host, port)


@PROPERTIES
@given(targets)
def test_every_valid_form_parses_exactly(built: Built) -> None:
    spec = parse_target(built.url)
    _check_exact(spec, built)
    _redis_py_agrees(spec)
    url = spec.url if spec.kind == "single" else spec.node_url(*spec.hosts[0])
    read = redis.connection.parse_url(url)
    for name, value in built.options.items():
        expected = {"true": True, "false": False}.get(value, value)
        assert str(read[name]) == str(expected) or read[name] == float(value), (name, read)
    if built.password is not None:
        assert quote(built.password, safe="") not in redact_target(built.url)
        assert built.password not in redact_target(built.url)
        assert built.password not in repr(spec)


def _secret_windows(text: str, password: str, user: str | None = None) -> list[str]:
    """Return the 4-character pieces of the password still lying before the text's last '@'.

    ``user``: the user name the parser read; a mutation may have turned the
    password into it (``unix://Pw0000::@/0``), and a user name is shown.
    """
    secret = text[: text.rfind("@")] if "@" in text else ""
    tail = text[len(secret) :] + (user or "") + quote(user or "", safe="")
    encoded = quote(password, safe="")
    pieces = {form[i : i + 4] for form in (password, encoded) for i in range(len(form) - 3)}
    return [p for p in pieces if p in secret and p not in tail and p not in WORDING]


@PROPERTIES
@given(mutated())
@example((Built("redis://h:1/0", "single", "redis", (("h", 1),), None, None, 0), "redis:/h:1/0"))
# The password became the user name, shown percent-encoded once redacted.
@example(
    (
        Built("unix://:Pw00000%3A@/0", "single", "unix", (), None, "Pw00000:", 0, None, "/0"),
        "unix://Pw00000%3A::@/0",
    )
)
def test_a_mutated_target_is_parsed_exactly_or_refused_without_its_password(
    case: tuple[Built, str],
) -> None:
    built, text = case
    try:
        spec = parse_target(text)
    except InvalidTarget as exc:
        message = str(exc)
        assert message.startswith(("invalid redis backend target", "redis backend target"))
        assert message.endswith(f"accepted forms: {ACCEPTED_FORMS}")
        if built.password is not None:
            for piece in _secret_windows(text, built.password):
                assert piece not in message, (piece, message)
        return
    # Accepted: it is what redis-py reads, and no host came from a default.
    _redis_py_agrees(spec)
    for host, _ in spec.hosts:
        assert host in text.lower()
    if built.password is not None and spec.password is not None:
        # (A target that lost the ':' before its password shows a user name.)
        for piece in _secret_windows(text, built.password, spec.username):
            assert piece not in redact_target(text)


@pytest.mark.parametrize(
    ("target", "fault"),
    [
        ("redis:/127.0.0.1:6500/0", "'redis:' must be followed by '//'"),
        ("redis:127.0.0.1:6500/0", "'redis:' must be followed by '//'"),
        ("redis:///0", "no host"),
        ("redis://:6379/0", "empty host"),
        ("redis://127.0.0.1:/0", "the port must be a number 1-65535 in '127.0.0.1:'"),
        ("redis://127.0.0.1:63x9/0", "the port must be a number 1-65535 in '127.0.0.1:63x9'"),
        ("redis://127.0.0.1:0/0", "the port must be a number 1-65535"),
        ("redis://127.0.0.1:6379/0/extra", "unexpected path '/0/extra'"),
        ("redis://127.0.0.1:6379/zero", "must be a db number, not 'zero'"),
        ("redis://127.0.0.1:6379/0?sockettimeout=5", "unknown option"),
        ("redis://127.0.0.1:6379/0?socket_timeout=soon", "option 'socket_timeout' must be"),
        ("redis://127.0.0.1:6379/0?db=2", "give the db in the path"),
        ("redis://127.0.0.1:6379/0?ssl_cert_reqs=none", "a TLS target (rediss://) is needed"),
        ("redis://h1:6379,h2:6379/0", "several hosts need redis+cluster://"),
        ("unix://tmp/redis.sock", "unix:// takes no host"),
        ("redis+cluster://h1:7000,h2", "needs a port (host:port): 'h2'"),
        ("redis+sentinel://h1:26379", "name the sentinel service"),
        ("tcp://127.0.0.1:6379/0", "unknown scheme 'tcp'"),
        ("simplebroker+redis://127.0.0.1:6379/0", "Celery takes simplebroker+redis://"),
    ],
)
def test_each_fault_is_named_with_the_accepted_forms(target: str, fault: str) -> None:
    with pytest.raises(InvalidTarget) as info:
        parse_target(target)
    message = str(info.value)
    assert fault in message
    assert message.endswith(f"accepted forms: {ACCEPTED_FORMS}")


@pytest.mark.parametrize(
    "target",
    [
        "redis:/:Pw-s3cret@127.0.0.1:6500/0",
        "redis://:Pw-s3cret@127.0.0.1:/0",
        "redis://user:Pw-s3cret@127.0.0.1:6379/0/x",
        "redis://:Pw/s3cret@127.0.0.1:6379/0",
        "redis://:Pw?s3cret@127.0.0.1:6379/0",
        "redis://:Pw#s3cret@127.0.0.1:6379/0",
        "redis://:Pw-s3cret@h:1/0?password=Pw-s3cret",
        "redis+cluster://:Pw-s3cret@h1:1,h2",
        "Pw-s3cret@127.0.0.1:6379",
    ],
)
def test_a_refused_target_never_shows_its_password(target: str) -> None:
    with pytest.raises(InvalidTarget) as info:
        parse_target(target)
    assert "s3cret" not in str(info.value)
    assert "s3cret" not in redact_target(target)


def test_redaction_keeps_the_user_and_a_path_with_an_at_sign() -> None:
    url = "rediss://app:Pw-s3cret@h:6380/0?ssl_ca_certs=/etc/certs@2026/ca.pem"
    assert redact_target(url) == "rediss://app:***@h:6380/0?ssl_ca_certs=/etc/certs@2026/ca.pem"
    assert parse_target(url).query == "ssl_ca_certs=/etc/certs@2026/ca.pem"
