"""Which server and which config: the one rule of the tools and every integration.

Where a runner connects, in this order:

1. the target the caller names (``--target`` of the tools, ``url=`` of the
   Taskiq and Dramatiq classes, the server in Celery's broker URL);
2. ``$SIMPLEBROKER_REDIS_URL`` (:data:`URL_ENV`), with the default namespace;
3. the SimpleBroker project of the working directory, found exactly as the
   ``broker`` command finds it (a ``.broker.toml`` in this directory or
   above, else ``BROKER_BACKEND=redis`` with ``BROKER_BACKEND_TARGET``): its
   target and its ``[backend_options]``, so the tools, the workers and
   ``broker peek`` see the same queues.

A named target never reads the project file, so what a process connects to
does not depend on its working directory. Options the caller gives win over
the project's, and a namespace the caller gives wins over both. SimpleBroker's
own config (``BROKER_*``: the password, the busy timeout, the message size
limit) is read from the environment, as its command line reads it
(:func:`environment_config`).

:func:`choose_server` applies the rule and returns a :class:`Target`; each
integration raises its own error type from :class:`TargetError`, with the
same message. Protean names its server in its broker table (``URI``, which
may also be a SQLite file) and uses :class:`Target` and
:func:`environment_config` only.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from simplebroker.ext import BrokerError
from simplebroker.project import resolve_broker_target

from .environment import environment_config
from .keys import DEFAULT_NAMESPACE
from .options import BackendOptions
from .runner import RedisRunner
from .runner.aio import AsyncRedisRunner
from .targets import InvalidTarget, parse_target, redact_target

__all__ = [
    "URL_ENV",
    "Target",
    "TargetError",
    "choose_server",
    "environment_config",
]

#: Environment variable naming the server when the caller names none.
URL_ENV: Final[str] = "SIMPLEBROKER_REDIS_URL"


class TargetError(ValueError):
    """No usable server was named, or its target is malformed (the message says what to do)."""


@dataclass(frozen=True, slots=True)
class Target:
    """Where a runner connects: a target URL, its backend options, and what named them.

    ``source`` (``url``, ``--target``, an environment variable, a config
    file's path) is for messages: a refused option says where it came from.
    """

    target: str
    options: Mapping[str, Any] = field(default_factory=dict)  #: ``[backend_options]``
    source: str = "url"

    def with_options(self, options: Mapping[str, Any]) -> Target:
        """Return this target with ``options`` over its own (a None value: not given)."""
        given = {name: value for name, value in options.items() if value is not None}
        return dataclasses.replace(self, options={**self.options, **given})

    def describe(self) -> str:
        """Return the target and namespace for messages and pages, any password replaced."""
        namespace = self.options.get("namespace") or DEFAULT_NAMESPACE
        return f"{redact_target(self.target)} namespace={namespace!r}"

    def runner(self, config: Mapping[str, Any] | None = None) -> RedisRunner:
        """Return a new runner of this target.

        ``config`` is SimpleBroker's (pool timeout, password); None reads the
        ``BROKER_*`` environment, as SimpleBroker's command line does.

        Raises:
            InvalidConfigError: A backend option is invalid (SimpleBroker's
                error, naming it).
            InvalidTarget: The target is malformed.

        """
        options = BackendOptions.parse(self.options)
        return RedisRunner(self.target, options, config=_config(config))

    def async_runner(self, config: Mapping[str, Any] | None = None) -> AsyncRedisRunner:
        """Return a new asyncio runner of this target (see :meth:`runner`)."""
        options = BackendOptions.parse(self.options)
        return AsyncRedisRunner(self.target, options, config=_config(config))


def _config(config: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return environment_config() if config is None else config


def choose_server(
    target: str | None = None,
    *,
    namespace: str | None = None,
    options: Mapping[str, Any] | None = None,
    source: str = "url",
    asked: str = "url=...",
    directory: Path | None = None,
) -> Target:
    """Return where to connect: ``target``, else ``$SIMPLEBROKER_REDIS_URL``, else the project.

    ``options`` (backend options the caller gives) win over the project's;
    ``namespace`` wins over both. ``source`` names the caller's own
    target in messages (``--target``, ``the broker URL``); ``asked`` is
    how a caller names a server (``--target redis://HOST:PORT/DB``,
    ``url=...``), for the message that says none is named. ``directory``:
    where the project search starts (default: the working directory).

    Raises:
        TargetError: Nothing names a server, the project config cannot be
            read or selects another backend, or the chosen target is
            malformed (the grammar's message, after where it came from).
        InvalidConfigError: A backend option is invalid (SimpleBroker's
            error, naming it).

    """
    given = dict(options or {})
    if target is not None:
        found = Target(target, given, source)
    elif os.environ.get(URL_ENV):
        found = Target(os.environ[URL_ENV], given, f"${URL_ENV}")
    else:
        found = _project(directory, asked).with_options(given)
    found = found.with_options({"namespace": namespace})
    try:
        parse_target(found.target)
    except InvalidTarget as exc:
        raise TargetError(f"{found.source}: {exc}") from None
    BackendOptions.parse(found.options)  # refuse bad options before anything connects
    return found


def _project(directory: Path | None, asked: str) -> Target:
    """Return the server of the SimpleBroker project, found as the ``broker`` command finds it."""
    here = (directory or Path.cwd()).resolve()
    try:
        config = environment_config()
    except (BrokerError, ValueError) as exc:
        raise TargetError(f"invalid SimpleBroker setting in the environment: {exc}") from exc
    try:
        resolved = resolve_broker_target(here, config=config)
    except (BrokerError, OSError, ValueError) as exc:
        raise TargetError(f"cannot read the SimpleBroker project config: {exc}") from exc
    if resolved is None or (resolved.backend_name == "sqlite" and resolved.config_path is None):
        name = None if resolved is None else resolved.backend_name
        found = "" if name is None else f" (found SimpleBroker backend {name!r})"
        raise TargetError(
            f"no server named: pass {asked}, set ${URL_ENV}, or add a .broker.toml with "
            f'backend = "redis" to {here} or a directory above (or set BROKER_BACKEND=redis '
            f"and BROKER_BACKEND_TARGET){found}"
        )
    where = str(resolved.config_path or "BROKER_BACKEND")
    if resolved.backend_name != "redis":
        raise TargetError(
            f"{where} selects SimpleBroker backend {resolved.backend_name!r}; "
            'simplebroker-redis needs backend = "redis"'
        )
    return Target(resolved.target, dict(resolved.backend_options), where)
