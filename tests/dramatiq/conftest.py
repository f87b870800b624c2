"""Fixtures of the Dramatiq integration's tests: brokers on the suite's server, a namespace each."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("dramatiq", reason="the dramatiq extra is not installed")

import dramatiq  # noqa: E402
from dramatiq import Worker  # noqa: E402

from dramatiq_simplebroker import SimpleBrokerDramatiqBroker  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture
def make_broker(
    redis_url: str, namespace: str
) -> Iterator[Callable[..., SimpleBrokerDramatiqBroker]]:
    """Factory: a broker on this test's namespace (set as Dramatiq's global broker)."""
    made: list[SimpleBrokerDramatiqBroker] = []

    def make(**options: Any) -> SimpleBrokerDramatiqBroker:
        options.setdefault("namespace", namespace)
        options.setdefault("lease_seconds", 2.0)
        broker = SimpleBrokerDramatiqBroker(redis_url, **options)
        broker.emit_after("process_boot")
        dramatiq.set_broker(broker)
        made.append(broker)
        return broker

    yield make
    for broker in made:
        broker.close()


@pytest.fixture
def dq_broker(make_broker: Callable[..., SimpleBrokerDramatiqBroker]) -> SimpleBrokerDramatiqBroker:
    """A broker on this test's namespace."""
    return make_broker()


@pytest.fixture
def make_worker() -> Iterator[Callable[..., Worker]]:
    """Factory: an in-process Dramatiq worker, stopped at the end of the test."""
    started: list[Worker] = []

    def make(broker: SimpleBrokerDramatiqBroker, **options: Any) -> Worker:
        options.setdefault("worker_timeout", 100)
        options.setdefault("worker_threads", 4)
        worker = Worker(broker, **options)
        worker.start()
        started.append(worker)
        return worker

    yield make
    for worker in started:
        worker.stop()
