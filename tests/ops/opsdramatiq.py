"""The Dramatiq app of the operations tests: ``dramatiq opsdramatiq`` runs it.

Configured by the environment of the other ops apps (``SIMPLEBROKER_REDIS_URL``,
``OPS_NS``, ``OPS_LOG``). Its actors consume the queue ``dramatiq`` and store
their results (the broker's result backend, so with the acknowledgement):

- ``ops.dq_slow`` notes ``dramatiq-start <tag>``, waits until the test
  creates ``release-<tag>`` beside the log (at most 60 s), notes
  ``dramatiq-done <tag>`` and returns the tag, so a test sees it running
  however slow the machine is;
- ``ops.dq_flaky`` raises ``ValueError`` while ``release-<tag>`` is missing
  (no retries: the message is nacked to ``dramatiq.XQ`` and the exception
  stored as its result), else notes ``dramatiq-ran <tag>`` and returns the tag.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import dramatiq
from dramatiq.results import Results

from dramatiq_simplebroker import SimpleBrokerDramatiqBroker, SimpleBrokerResultBackend
from support.eventlog import note

URL = os.environ.get("SIMPLEBROKER_REDIS_URL", "redis://127.0.0.1:6379/0")
NS = os.environ.get("OPS_NS", "ops")
LOG = os.environ.get("OPS_LOG", os.devnull)
QUEUE = "dramatiq"

broker = SimpleBrokerDramatiqBroker(URL, namespace=NS, lease_seconds=2.0, heartbeat_interval=0.3)
broker.add_middleware(Results(backend=SimpleBrokerResultBackend(broker=broker)))
dramatiq.set_broker(broker)


def released(tag: str) -> bool:
    return (Path(LOG).parent / f"release-{tag}").exists()


@dramatiq.actor(actor_name="ops.dq_slow", queue_name=QUEUE, store_results=True, max_retries=0)
def dq_slow(tag: str) -> str:
    note(LOG, "dramatiq-start", tag)
    deadline = time.monotonic() + 60
    while not released(tag) and time.monotonic() < deadline:
        time.sleep(0.05)
    note(LOG, "dramatiq-done", tag)
    return tag


@dramatiq.actor(actor_name="ops.dq_flaky", queue_name=QUEUE, store_results=True, max_retries=0)
def dq_flaky(tag: str) -> str:
    if not released(tag):
        note(LOG, "dramatiq-fail", tag)
        raise ValueError(f"{tag} is not released yet")
    note(LOG, "dramatiq-ran", tag)
    return tag
