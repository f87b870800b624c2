"""Runners of the Taskiq classes: which server and namespace, and closing them.

The broker, the result backend and the schedule source each build their
:class:`~simplebroker_redis.AsyncRedisRunner` here (or share one passed
as ``runner=``), so none of them imports another for it.

Without ``url`` or ``runner`` the server is ``$SIMPLEBROKER_REDIS_URL``
(with the default namespace), else the SimpleBroker project of the working
directory, found exactly as the ``broker`` command finds it: the rule of
:mod:`simplebroker_redis.server`, which the tools and every integration
follow. An explicit ``url`` never reads the project file; an explicit
``namespace=`` wins over the project's. ``BROKER_BACKEND_PASSWORD`` is used
whenever the URL has no password.
"""

from __future__ import annotations

import difflib
import inspect
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, TypedDict
from urllib.parse import quote, urlencode, urlsplit, urlunsplit

from simplebroker import Config
from simplebroker.ext import BrokerError, InvalidConfigError

from simplebroker_redis import AsyncRedisRunner
from simplebroker_redis import server as server_rule
from simplebroker_redis.options import DEFAULT_MAX_CONNECTIONS, BackendOptions
from simplebroker_redis.server import Target, TargetError
from simplebroker_redis.target_query import QUERY_OPTIONS, TLS_QUERY_OPTIONS

from .errors import ConfigurationError

logger = logging.getLogger("taskiq_simplebroker")

#: redis-py connection options accepted as extra keyword arguments (as
#: taskiq-redis passes ``**connection_kwargs``). They travel in the URL's
#: query string, which redis-py reads for every pool and Pub/Sub connection
#: of the runner (the README's TLS options use the same route): exactly the
#: options the target grammar accepts in a query.
URL_OPTIONS: Final[frozenset[str]] = frozenset(QUERY_OPTIONS) | frozenset(TLS_QUERY_OPTIONS)

#: Keywords of the broker and the result backend that are ``[backend_options]``.
BACKEND_KEYWORDS: Final[tuple[str, ...]] = (
    "wait_replicas",
    "wait_timeout",
    "wait_aof",
    "sentinel_password",
)

#: Options the URL's user part carries (redacted wherever the URL is shown).
_USER_OPTIONS: Final[frozenset[str]] = frozenset({"username", "password"})

#: redis-py options the backend sets itself, and why they cannot be changed.
_OWN_OPTIONS: Final[dict[str, str]] = {
    "decode_responses": "the backend reads replies as text",
    "retry": "commands are never retried blindly: a lost reply may hide a committed write",
    "retry_on_timeout": "commands are never retried blindly",
    "retry_on_error": "commands are never retried blindly",
    "protocol": "the backend speaks RESP2",
    "max_connections": "use max_connections= (or max_connection_pool_size=)",
    "db": "give the database number in the URL",
}


def choose_server(url: str | None) -> Target:
    """Return the server of ``url``, else of the environment or the project config.

    Raises:
        ConfigurationError: Nothing names a server, the project's broker is
            not a Redis one, its config is invalid, or the target is malformed.

    """
    try:
        return server_rule.choose_server(url, asked="url=... or runner=...")
    except (TargetError, BrokerError, ValueError) as exc:
        raise ConfigurationError(str(exc)) from None


def environment_config() -> Config:
    """Return SimpleBroker's config from the environment (``BROKER_*``), as its CLI reads it."""
    try:
        return server_rule.environment_config()
    except (BrokerError, ValueError) as exc:
        raise ConfigurationError(f"invalid SimpleBroker setting in the environment: {exc}") from exc


class ServerKeywords(TypedDict, total=False):
    """Where a Taskiq class connects: the keywords all three classes take.

    A ``runner`` to share (then no other keyword), or what a runner made
    here from ``url`` uses: the namespace, the pool, and redis-py
    connection options (:data:`URL_OPTIONS`, ``username``, ``password``).
    Declared once, as typed keywords (``**server: Unpack[ServerKeywords]``),
    and read in one place, :func:`open_runner`.
    """

    runner: AsyncRedisRunner | None
    namespace: str | None
    max_connections: int | None
    max_connection_pool_size: int | None  # taskiq-redis's name for max_connections
    username: str
    password: str
    socket_timeout: float
    socket_connect_timeout: float
    socket_keepalive: bool
    health_check_interval: int
    client_name: str
    ssl_certfile: str
    ssl_keyfile: str
    ssl_ca_certs: str
    ssl_ca_path: str
    ssl_cert_reqs: str
    ssl_check_hostname: bool


class DurableServerKeywords(ServerKeywords, total=False):
    """:class:`ServerKeywords` and the backend options of :data:`BACKEND_KEYWORDS`."""

    wait_replicas: int | None
    wait_timeout: float | None
    wait_aof: bool | None
    sentinel_password: str | None


#: Keywords of :class:`ServerKeywords` that are this package's, not redis-py's.
_SERVER_KEYWORDS: Final[tuple[str, ...]] = (
    "runner",
    "namespace",
    "max_connections",
    "max_connection_pool_size",
)


def check_keywords(
    owner: Callable[..., object], keywords: Iterable[str], backend_keywords: Iterable[str]
) -> None:
    """Refuse a keyword neither ``owner`` (a Taskiq class) nor redis-py takes.

    The error lists ``owner``'s options and redis-py's connection options
    apart, and suggests the nearest name (``lease_second``: ``lease_seconds``).

    Raises:
        ConfigurationError: An unknown keyword.

    """
    parameters = inspect.signature(owner).parameters.values()
    ours = {p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    ours |= {*_SERVER_KEYWORDS, *backend_keywords}
    theirs = URL_OPTIONS | _USER_OPTIONS
    for name in keywords:
        if name in ours or name in theirs or name in _OWN_OPTIONS:
            continue
        close = difflib.get_close_matches(name, [*ours, *theirs], n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        what = getattr(owner, "__name__", "this class")
        raise ConfigurationError(
            f"{what}: unknown option {name!r}{hint} (its options: {', '.join(sorted(ours))}; "
            f"redis-py connection options: {', '.join(sorted(theirs))})"
        )


def open_runner(
    url: str | None,
    server: ServerKeywords,
    *,
    owner: Callable[..., object],
    default_max_connections: int = DEFAULT_MAX_CONNECTIONS,
    backend_keywords: Iterable[str] = BACKEND_KEYWORDS,
) -> tuple[AsyncRedisRunner, bool]:
    """Return the runner a Taskiq class (``owner``) uses, and whether it made (and so owns) it.

    ``server`` holds the class's connection keywords as given (see
    :class:`ServerKeywords`); an unknown one is refused here
    (:func:`check_keywords`), a bad value by :func:`make_runner`.
    """
    check_keywords(owner, server, backend_keywords)
    keywords: dict[str, Any] = dict(server)
    runner = keywords.pop("runner", None)
    namespace = keywords.pop("namespace", None)
    pool = pool_size(
        keywords.pop("max_connections", None), keywords.pop("max_connection_pool_size", None)
    )
    made = make_runner(
        url,
        runner,
        namespace,
        pool,
        keywords,
        default_max_connections=default_max_connections,
        backend_keywords=backend_keywords,
    )
    return made, runner is None


def pool_size(max_connections: int | None, max_connection_pool_size: int | None) -> int | None:
    """Return the pool size given under either name (the second is taskiq-redis's)."""
    if max_connections is not None and max_connection_pool_size is not None:
        raise ConfigurationError("pass max_connections or max_connection_pool_size, not both")
    return max_connections if max_connections is not None else max_connection_pool_size


def _option_text(name: str, value: object) -> str:
    """Return the URL form of one connection option, or raise why it cannot be set."""
    reason = _OWN_OPTIONS.get(name)
    if reason is not None:
        raise ConfigurationError(f"connection option {name!r} cannot be set: {reason}")
    if name not in URL_OPTIONS and name not in _USER_OPTIONS:
        known = ", ".join(sorted(URL_OPTIONS | _USER_OPTIONS))
        raise ConfigurationError(f"unknown connection option {name!r} (supported: {known})")
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int, float)):
        return str(value)
    raise ConfigurationError(
        f"connection option {name!r} must be a string, number or bool, not {type(value).__name__}"
    )


def with_connection_options(target: str, options: Mapping[str, Any]) -> str:
    """Return ``target`` carrying redis-py connection ``options`` (see :data:`URL_OPTIONS`).

    Raises:
        ConfigurationError: An option the backend sets itself, one it does
            not know, or a value a URL cannot carry.

    """
    texts = {
        name: _option_text(name, value) for name, value in options.items() if value is not None
    }
    if not texts:
        return target
    parts = urlsplit(target)
    netloc = parts.netloc
    if texts.keys() & _USER_OPTIONS:
        if parts.username is not None or parts.password is not None:
            raise ConfigurationError("the URL names a user or password already")
        userinfo = quote(texts.pop("username", ""), safe="")
        if "password" in texts:
            userinfo += ":" + quote(texts.pop("password"), safe="")
        netloc = f"{userinfo}@{netloc}"
    joined = "&".join(part for part in (parts.query, urlencode(texts)) if part)
    return urlunsplit((parts.scheme, netloc, parts.path, joined, parts.fragment))


def make_runner(
    url: str | None,
    runner: AsyncRedisRunner | None,
    namespace: str | None,
    max_connections: int | None,
    keywords: Mapping[str, Any],
    *,
    default_max_connections: int = DEFAULT_MAX_CONNECTIONS,
    backend_keywords: Iterable[str] = BACKEND_KEYWORDS,
) -> AsyncRedisRunner:
    """Return ``runner``, or a new one for the chosen server (see the module docstring).

    Every Taskiq class makes its runner here. ``keywords`` are its
    connection keywords (a None value: not given): the backend options
    named in ``backend_keywords``, over the project's, and redis-py
    connection options (:data:`URL_OPTIONS`).
    """
    connection_options = {name: value for name, value in keywords.items() if value is not None}
    given = {
        name: connection_options.pop(name)
        for name in backend_keywords
        if name in connection_options
    }
    if runner is not None:
        if url is not None:
            raise ConfigurationError("pass url or runner, not both")
        if namespace is not None and namespace != runner.keys.namespace:
            raise ConfigurationError("namespace differs from the runner's namespace")
        if connection_options or given:
            raise ConfigurationError(
                "connection and backend options apply where the runner is made"
            )
        return runner
    options = {"namespace": namespace, "max_connections": max_connections, **given}
    check_options(options)
    # The target as given is checked there, before options are added to it: a
    # malformed one is refused with the grammar's message.
    chosen = choose_server(url)
    target = with_connection_options(chosen.target, connection_options)
    defaults = {"max_connections": default_max_connections, **chosen.options}
    made = Target(target, defaults, chosen.source).with_options(options)
    try:
        return made.async_runner(environment_config())
    except (BrokerError, ValueError) as exc:
        raise ConfigurationError(f"{chosen.source}: {exc}") from exc


def check_options(options: Mapping[str, Any]) -> None:
    """Refuse a bad backend option given as a keyword (None: not given), naming the keyword.

    Checked apart from the server's own options, so the error names the
    keyword (``namespace='a b'``), not where the server came from (``url``).
    """
    given = {name: value for name, value in options.items() if value is not None}
    try:
        BackendOptions.parse(given)
    except InvalidConfigError as exc:
        name = exc.key.removeprefix("backend_options.")
        raise ConfigurationError(
            f"invalid {name}={exc.value_display}: expected {exc.expected}"
        ) from None


async def close_runner(runner: AsyncRedisRunner) -> None:
    """Close the running loop's pool of ``runner``; a failure is only logged.

    Shutdown must go on even when closing sockets fails (a server that went
    away, a connection reset).
    """
    try:
        await runner.aclose()
    except Exception as exc:  # noqa: BLE001 - see the docstring
        logger.debug("closing the connection pool failed: %s", exc)
