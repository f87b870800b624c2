"""A Celery app on simplebroker-redis (transport and result backend).

    cd examples && SIMPLEBROKER_REDIS_URL=redis://127.0.0.1:6379/0 celery -A celery_app worker

The two settings under which nothing is lost when a worker dies are on:
``task_acks_late`` (a task is acknowledged after it ran, not before) and
``task_reject_on_worker_lost`` (a task whose pool process died is requeued).
A worker that dies as a whole (SIGKILL, OOM, power loss) needs neither: its
leases expire and another worker takes its tasks within ``lease_seconds``.
Tasks can run more than once (at-least-once delivery): keep them idempotent.
"""

from __future__ import annotations

import os
import time

from celery import Celery

import celery_simplebroker  # noqa: F401 - registers the "simplebroker" kombu transport

URL = os.environ.get("SIMPLEBROKER_REDIS_URL", "redis://127.0.0.1:6379/0")

app = Celery("celery_app")
app.conf.update(
    broker_url=f"simplebroker+{URL}",
    result_backend=f"simplebroker+{URL}",
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    result_expires=3600,
    # Optional; these are the defaults:
    broker_transport_options={"lease_seconds": 10, "heartbeat_interval": 2},
)


@app.task
def add(a: int, b: int) -> int:
    """Return a + b."""
    return a + b


@app.task
def tsum(values: list[int]) -> int:
    """Return the sum of ``values`` (a chord body)."""
    return sum(values)


@app.task
def slow(seconds: float) -> float:
    """Sleep ``seconds`` (longer than the lease is fine: the heartbeat renews it)."""
    time.sleep(seconds)
    return seconds
