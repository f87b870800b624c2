"""Runners of the Taskiq classes: which server and namespace, and closing them.

The broker, the result backend and the schedule source each build their
:class:`~simplebroker_redis.aio.AsyncRedisRunner` here (or share one passed
as ``runner=``), so none of them imports another for it.
"""

from __future__ import annotations

import logging
import os
from typing import Final

from simplebroker_redis import DEFAULT_NAMESPACE
from simplebroker_redis.aio import AsyncRedisRunner

from .errors import ConfigurationError

logger = logging.getLogger("taskiq_simplebroker")

#: Environment variable naming the server when no ``url`` is given.
URL_ENV: Final[str] = "SIMPLEBROKER_REDIS_URL"


def resolve_url(url: str | None) -> str:
    """Return ``url``, or ``$SIMPLEBROKER_REDIS_URL`` when it is None."""
    if url is not None:
        return url
    env = os.environ.get(URL_ENV)
    if not env:
        raise ConfigurationError(f"pass url=... or runner=..., or set ${URL_ENV}")
    return env


def make_runner(
    url: str | None,
    runner: AsyncRedisRunner | None,
    namespace: str | None,
    max_connections: int,
) -> AsyncRedisRunner:
    """Return ``runner``, or a new one for ``url`` (shared by the integration's classes)."""
    if runner is not None:
        if url is not None:
            raise ConfigurationError("pass url or runner, not both")
        if namespace is not None and namespace != runner.keys.namespace:
            raise ConfigurationError("namespace differs from the runner's namespace")
        return runner
    return AsyncRedisRunner(
        resolve_url(url),
        namespace=namespace or DEFAULT_NAMESPACE,
        max_connections=max_connections,
    )


async def close_runner(runner: AsyncRedisRunner) -> None:
    """Close the running loop's pool of ``runner``; a failure is only logged.

    Shutdown must go on even when closing sockets fails (a server that went
    away, a connection reset).
    """
    try:
        await runner.aclose()
    except Exception as exc:  # noqa: BLE001 - see the docstring
        logger.debug("closing the connection pool failed: %s", exc)
