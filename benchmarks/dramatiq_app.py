"""The Dramatiq app of the benchmark: ``dramatiq dramatiq_app`` on either broker.

``DQB_BROKER`` picks the broker: ``simplebroker`` (ours, namespace
``DQB_NAMESPACE``) or ``redis`` (Dramatiq's ``RedisBroker`` and
``RedisBackend``, key namespace ``DQB_NAMESPACE``), both on ``DQB_URL``.
``DQB_LOG`` receives a line per start of ``hold`` (the recovery
measurement); ``DQB_REDIS_OPTIONS`` is JSON of more RedisBroker keywords.
"""

from __future__ import annotations

import json
import os
import time

import dramatiq
from dramatiq.results import Results

KIND = os.environ.get("DQB_BROKER", "simplebroker")
URL = os.environ["DQB_URL"]
NAMESPACE = os.environ.get("DQB_NAMESPACE", "dqbench")
LOG = os.environ.get("DQB_LOG", "")

if KIND == "redis":
    from dramatiq.brokers.redis import RedisBroker
    from dramatiq.results.backends import RedisBackend

    options = json.loads(os.environ.get("DQB_REDIS_OPTIONS") or "{}")
    broker = RedisBroker(url=URL, namespace=NAMESPACE, **options)
    backend = RedisBackend(url=URL, namespace=f"{NAMESPACE}-results")
else:
    from dramatiq_simplebroker import SimpleBrokerDramatiqBroker, SimpleBrokerResultBackend

    broker = SimpleBrokerDramatiqBroker(URL, namespace=NAMESPACE)
    backend = SimpleBrokerResultBackend(broker=broker)
broker.add_middleware(Results(backend=backend))
dramatiq.set_broker(broker)


@dramatiq.actor(store_results=True, max_retries=0)
def echo(value: int) -> int:
    """Return ``value`` (the task of the throughput measurement)."""
    return value


@dramatiq.actor(max_retries=0)
def hold(key: str, seconds: float) -> None:
    """Note a start, then sleep (the task a SIGKILL interrupts)."""
    if LOG:
        fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(fd, f"{time.time()} {os.getpid()} {key}\n".encode())
        os.close(fd)
    time.sleep(seconds)
