"""The nemesis suite's Dramatiq app: ``dramatiq dramatiq_worker --processes 1 --threads 2``.

It reads ``NEMESIS_URL``, ``NEMESIS_NS``, ``NEMESIS_LOG`` (its event log),
``NEMESIS_LEASE`` and, optionally, ``NEMESIS_WAIT_REPLICAS`` and
``NEMESIS_WAIT_TIMEOUT``. Its one actor, ``witness``, notes ``start <key>``
and ``done <key>`` around its work and returns ``[key, pid]``, stored by
the result backend in the acknowledgement's script: the stored result says
which process wrote it.
"""

from __future__ import annotations

import os
import time
from typing import Any

import dramatiq
from dramatiq.results import Results

from dramatiq_simplebroker import SimpleBrokerDramatiqBroker, SimpleBrokerResultBackend
from support.eventlog import note

#: The actor's queue (Dramatiq's default).
QUEUE = "default"


def durability() -> dict[str, float]:
    """Return ``wait_replicas``/``wait_timeout`` from NEMESIS_WAIT_REPLICAS/_TIMEOUT (none: off)."""
    if not os.environ.get("NEMESIS_WAIT_REPLICAS"):
        return {}
    return {
        "wait_replicas": int(os.environ["NEMESIS_WAIT_REPLICAS"]),
        "wait_timeout": float(os.environ.get("NEMESIS_WAIT_TIMEOUT", "1.0")),
    }


def make_broker(
    url: str, namespace: str, lease: float, options: dict[str, float] | None = None
) -> SimpleBrokerDramatiqBroker:
    """Return a broker with the result backend, on the timings the other workloads use.

    ``options`` (``wait_replicas``/``wait_timeout``) default to this process's
    environment: the workers get them there, the producer passes its run's.
    """
    broker = SimpleBrokerDramatiqBroker(
        url,
        namespace=namespace,
        lease_seconds=lease,
        heartbeat_interval=min(2.0, lease / 4),
        recover_interval=min(1.0, lease / 4),
        backend_options=durability() if options is None else options,
    )
    broker.add_middleware(Results(backend=SimpleBrokerResultBackend(broker=broker)))
    return broker


def declare(broker: dramatiq.Broker, fn: Any) -> Any:
    """Declare ``fn`` as the ``witness`` actor on ``broker``."""
    return dramatiq.actor(
        fn,
        actor_name="witness",
        queue_name=QUEUE,
        broker=broker,
        max_retries=0,
        store_results=True,
    )


if "NEMESIS_LOG" in os.environ:  # imported by the dramatiq CLI, not by the harness
    LOG = os.environ["NEMESIS_LOG"]
    broker = make_broker(
        os.environ["NEMESIS_URL"], os.environ["NEMESIS_NS"], float(os.environ["NEMESIS_LEASE"])
    )
    dramatiq.set_broker(broker)

    def witness(key: str, seconds: float) -> list[Any]:
        """Work ``seconds`` between a start and a done event; return ``[key, pid]``."""
        note(LOG, "start", key)
        time.sleep(seconds)
        note(LOG, "done", key)
        return [key, os.getpid()]

    witness_actor = declare(broker, witness)
