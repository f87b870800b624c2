"""Celery's URLs for this package, checked with the backend's target grammar.

Celery and kombu read ``simplebroker+redis://host:6379/0`` by splitting at
``+`` and ``://``. A URL that lost a slash (``simplebroker+redis:/127.0.0.1:
6379/0``) falls through both: kombu takes it for the host name of an AMQP
broker and retries its DNS lookup for minutes; Celery's result backend
imports it as a module (``ModuleNotFoundError: No module named
'simplebroker+redis:/127'``). Neither calls this package for it.

So importing ``celery_simplebroker`` puts the grammar's message in both
places:

- :func:`check_app_urls` runs when any Celery app is finalized (a worker's
  or beat's start) and when the result backend is made: a setting that
  names this package (``simplebroker+...``) but does not parse is refused
  before Celery connects to anything;
- a client that sends a task before its app is finalized resolves the
  result backend first, by importing the URL as a module: an import hook
  (:class:`CeleryURLFinder`) answers for module names no Python module can
  have (``simplebroker+...``, ``simplebroker:...``) with that message.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import re
import sys
from collections.abc import Iterator, Sequence
from types import ModuleType
from typing import Any, Final

from celery import current_app
from celery._state import connect_on_app_finalize

from simplebroker_redis.targets import InvalidTarget, parse_target, redact_target

from .options import ConfigurationError

#: Celery settings that may hold a broker or result backend URL.
URL_SETTINGS: Final[tuple[str, ...]] = (
    "broker_url",
    "broker_read_url",
    "broker_write_url",
    "result_backend",
)

#: A URL (or a module name made of one) that names this package.
_OURS: Final = re.compile(r"(?i)simplebroker[+:]")


def _urls(value: Any) -> Iterator[str]:
    """Yield each URL of a setting: a string (alternates split at ';') or a list of them."""
    if isinstance(value, str):
        yield from (url.strip() for url in value.split(";") if url.strip())
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _urls(item)


def celery_target(setting: str, url: str) -> str | None:
    """Return the backend target of a ``simplebroker+<target>`` URL (None for other URLs).

    ``simplebroker://`` (the server from ``$SIMPLEBROKER_REDIS_URL``, else the
    project's ``.broker.toml``: :mod:`simplebroker_redis.server`) also gives None.

    Raises:
        ConfigurationError: ``url`` names this package but is malformed.

    """
    if not _OURS.match(url):
        return None
    scheme_end = len("simplebroker")
    if url[scheme_end : scheme_end + 1] == "+":
        target = url[scheme_end + 1 :]
        try:
            parse_target(target)
        except InvalidTarget as exc:
            raise ConfigurationError(f"{setting}: {exc}") from None
        return target
    if url[scheme_end:].startswith("://"):
        return None
    raise ConfigurationError(
        f"{setting}: {redact_target(url)!r} is not simplebroker+<target> "
        "(simplebroker+redis://host:port/db) nor simplebroker:// (the server in "
        "$SIMPLEBROKER_REDIS_URL, else the project's .broker.toml)"
    )


def check_app_urls(app: Any) -> None:
    """Refuse a malformed ``simplebroker`` URL in the app's broker or backend settings."""
    for setting in URL_SETTINGS:
        for url in _urls(app.conf.get(setting)):
            celery_target(setting, url)


connect_on_app_finalize(check_app_urls)


class MalformedCeleryURL(ModuleNotFoundError):
    """Celery imported a malformed ``simplebroker`` URL as a module; the message says why."""


class CeleryURLFinder(importlib.abc.MetaPathFinder):
    """Answers Celery's import of a malformed ``simplebroker`` URL with the grammar's message.

    Only names that contain ``+`` or ``:`` match, which no module can have,
    so no real import is ever affected.
    """

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        """Raise :class:`MalformedCeleryURL` for ``simplebroker+...``; None for anything else."""
        if path is not None or not _OURS.match(fullname):
            return None
        raise MalformedCeleryURL(_explain(), name=fullname)


def _explain() -> str:
    """Return why the current app's ``simplebroker`` URL is malformed."""
    try:
        check_app_urls(current_app)
    except ConfigurationError as exc:
        return str(exc)
    return (
        "a simplebroker URL lost its '://': write simplebroker+redis://host:port/db "
        "(the part after 'simplebroker+' is a redis backend target)"
    )


if not any(isinstance(finder, CeleryURLFinder) for finder in sys.meta_path):
    sys.meta_path.append(CeleryURLFinder())
