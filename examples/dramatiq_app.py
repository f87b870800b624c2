"""A Dramatiq app on simplebroker-redis (broker and result backend).

    cd examples
    SIMPLEBROKER_REDIS_URL=redis://127.0.0.1:6379/0 dramatiq dramatiq_app -p 2 -t 4

Without ``SIMPLEBROKER_REDIS_URL`` the broker reads the ``.broker.toml`` of
the working directory (``backend = "redis"``), as the ``broker`` command
does. A worker that dies (SIGKILL, OOM, power loss) loses nothing: its
leases expire and another worker takes its messages within
``lease_seconds`` (10 s). Tasks can run more than once (at-least-once
delivery): keep them idempotent.
"""

from __future__ import annotations

import os
import time

import dramatiq
from dramatiq.results import Results

from dramatiq_simplebroker import SimpleBrokerDramatiqBroker, SimpleBrokerResultBackend

broker = SimpleBrokerDramatiqBroker(
    os.environ.get("SIMPLEBROKER_REDIS_URL"),
    # Optional; these are the defaults:
    lease_seconds=10,
    dead_message_ttl=7 * 86_400_000,
)
broker.add_middleware(Results(backend=SimpleBrokerResultBackend(broker=broker)))
dramatiq.set_broker(broker)


@dramatiq.actor(store_results=True)
def add(a: int, b: int) -> int:
    """Return a + b."""
    return a + b


@dramatiq.actor(store_results=True, priority=-1)
def urgent(text: str) -> str:
    """Return ``text`` upper-cased; priority -1 runs before the queue's priority-0 messages."""
    return text.upper()


@dramatiq.actor(store_results=True, time_limit=60_000)
def slow(seconds: float) -> float:
    """Sleep ``seconds`` (longer than the lease: the heartbeat keeps it)."""
    time.sleep(seconds)
    return seconds


@dramatiq.actor(max_retries=2, min_backoff=200, max_backoff=400)
def flaky() -> None:
    """Always fail: retried twice (delayed by the storage), then dead-lettered to default.XQ."""
    raise RuntimeError("flaky failed")
