"""Refuse a server that may evict queued tasks (``maxmemory-policy allkeys-*``).

Under an ``allkeys-*`` policy a server that reaches ``maxmemory`` deletes
arbitrary keys, so the namespace's message, reservation and meta keys can
vanish and every queued task with them. Under ``volatile-*`` only keys with
an expiry are candidates: results and progress stored with
``result_ex_time``/``result_px_time`` may disappear early, messages never
(they carry no expiry). ``noeviction`` refuses writes instead.

The policy is read from ``INFO memory`` first: a least-privilege ACL user
may run INFO (README's ACL line grants it) but should not get ``CONFIG``,
which also reveals secrets; ``CONFIG GET`` is the fallback for servers whose
INFO lacks the field. Managed services that allow neither are let through
with a log line.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from simplebroker_redis import AsyncRedisRunner

from .errors import EvictionPolicyError, is_transient

logger = logging.getLogger("taskiq_simplebroker")


async def _ask(runner: AsyncRedisRunner, command: Callable[[Any], Any]) -> Any:
    """Return the reply of a read-only ``command``, or the error it raised unless transient."""
    try:
        return await runner.execute(command, idempotent=True)
    except Exception as exc:
        if is_transient(exc):
            raise
        return exc


async def read_policy(runner: AsyncRedisRunner) -> str | None:
    """Return the server's ``maxmemory-policy``, or None when it cannot be read.

    Transient failures (server unreachable) propagate.
    """
    info = await _ask(runner, lambda client: client.info("memory"))
    if isinstance(info, Exception):
        logger.debug("INFO memory failed at %s: %s", runner.where, info)
    elif info.get("maxmemory_policy"):
        return str(info["maxmemory_policy"])
    config = await _ask(runner, lambda client: client.config_get("maxmemory-policy"))
    if isinstance(config, Exception):
        logger.info(
            "cannot read maxmemory-policy at %s (%s); make sure it is noeviction or volatile-*",
            runner.where,
            config,
        )
        return None
    value = config.get("maxmemory-policy")
    return str(value) if value else None


def check_policy(policy: str | None, *, allow_eviction: bool, where: str, owner: str) -> None:
    """Raise :class:`EvictionPolicyError` for an ``allkeys-*`` policy unless allowed."""
    if policy is None or not policy.startswith("allkeys-"):
        return
    if allow_eviction:
        logger.warning(
            "%s has maxmemory-policy %s: queued tasks may be evicted (allowed by allow_eviction)",
            where,
            policy,
        )
        return
    raise EvictionPolicyError(
        f"{where} has maxmemory-policy {policy}: when it runs out of memory the server "
        "deletes any key, queued tasks included. Set maxmemory-policy to noeviction "
        "(or volatile-*, which evicts only keys with an expiry, such as expiring results), "
        f"or pass allow_eviction=True to {owner} to start anyway"
    )


async def check_server(runner: AsyncRedisRunner, *, allow_eviction: bool, owner: str) -> None:
    """Read the server's eviction policy and refuse ``allkeys-*`` (see :func:`check_policy`)."""
    policy = await read_policy(runner)
    check_policy(policy, allow_eviction=allow_eviction, where=runner.where, owner=owner)
