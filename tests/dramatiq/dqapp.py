"""The Dramatiq app of the worker-process tests: ``dramatiq dqapp`` runs it.

Its server, namespace, event log and lease come from the environment
(``DQ_URL``, ``DQ_NAMESPACE``, ``DQ_LOG``, ``DQ_LEASE``), so each test's
workers share its namespace. Every task notes its start and its end in the
event log (``support.eventlog``): the tests count what ran, where and how
often.
"""

from __future__ import annotations

import os
import time

import dramatiq
from dramatiq.results import Results

from dramatiq_simplebroker import SimpleBrokerDramatiqBroker, SimpleBrokerResultBackend
from support.eventlog import note

LOG = os.environ["DQ_LOG"]
LEASE = float(os.environ.get("DQ_LEASE", "10"))

broker = SimpleBrokerDramatiqBroker(
    os.environ["DQ_URL"],
    namespace=os.environ["DQ_NAMESPACE"],
    lease_seconds=LEASE,
    recover_interval=min(1.0, LEASE / 4),
)
broker.add_middleware(Results(backend=SimpleBrokerResultBackend(broker=broker)))
dramatiq.set_broker(broker)


@dramatiq.actor(store_results=True, max_retries=0)
def work(key: str, seconds: float = 0.0) -> str:
    """Sleep ``seconds`` between a start and a done event; return the key."""
    note(LOG, "start", key)
    time.sleep(seconds)
    note(LOG, "done", key)
    return key


@dramatiq.actor(max_retries=0)
def spin(key: str, seconds: float) -> None:
    """Keep the CPU busy in pure Python for ``seconds`` (the GIL is handed over every 5 ms)."""
    note(LOG, "start", key)
    end, count = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        count += 1
    note(LOG, "done", key)
