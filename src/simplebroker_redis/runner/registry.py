"""The process-wide runners that cores built from a target borrow.

``create_core``, an ephemeral ``Queue`` operation and the plugin's namespace
hooks ask :func:`shared_runner` for the runner of their (target, options,
config) instead of paying for a new pool, connection and namespace check
each time. A deleted namespace's runners are released
(:func:`release_shared_runners`); the rest are closed at interpreter exit.
"""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Mapping
from typing import Any

from ..connection import config_settings
from ..options import BackendOptions
from .sync import RedisRunner

_SHARED: dict[tuple[Any, ...], RedisRunner] = {}
_SHARED_LOCK = threading.Lock()


def shared_runner(
    target: str,
    options: BackendOptions,
    config: Mapping[str, Any] | None,
) -> RedisRunner:
    """Return the process-wide runner for (target, options), creating it once.

    Cores built from a target (``create_core``, ephemeral ``Queue``
    operations) borrow these runners, so an operation does not pay for a new
    pool, connection and namespace check each time.
    """
    key = (os.getpid(), target, options, *config_settings(config))
    with _SHARED_LOCK:
        runner = _SHARED.get(key)
        if runner is None:
            runner = _SHARED[key] = RedisRunner(target, options, config=config)
        return runner


def release_shared_runners(namespace: str) -> None:
    """Drop and disconnect the shared runners of ``namespace`` (it was deleted).

    Without this a process that deletes many namespaces (a test suite, a tool
    sweeping old ones) would keep a pool of connections open for each of them
    until it exits. A core still holding one of these runners reconnects, and
    initializes the namespace again, on its next call.
    """
    with _SHARED_LOCK:
        mine = [key for key, runner in _SHARED.items() if runner.options.namespace == namespace]
        released = [_SHARED.pop(key) for key in mine]
    for runner in released:
        runner.mark_initialized(False)
        runner.close()


@atexit.register
def _close_shared_runners() -> None:
    with _SHARED_LOCK:
        runners = list(_SHARED.values())
        _SHARED.clear()
    for runner in runners:
        try:
            runner.close()
        except Exception:  # noqa: BLE001 - best effort at interpreter exit
            pass
