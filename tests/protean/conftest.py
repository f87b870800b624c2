"""Fixtures of the Protean provider's tests: both backends, brokers, worker processes.

Tests that take ``backend`` run twice: on the suite's Valkey/Redis server
(their own namespace) and on a SQLite file of their own. ``make_broker``
builds providers the way Protean does (a ``Domain`` and its broker table);
``start_worker`` starts Protean's engine on ``papp`` in a process of its
own, killed at the end of the test.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("protean", reason="the protean extra is not installed")

from phelpers import HEARTBEAT, HERE, LEASE, PYTHONPATH  # noqa: E402
from protean.domain import Domain  # noqa: E402

from protean_simplebroker import SimpleBrokerBroker  # noqa: E402
from support.processes import Children, Process  # noqa: E402


@pytest.fixture(params=["redis", "sqlite"])
def backend(request: pytest.FixtureRequest) -> str:
    """The backend a test runs on."""
    return str(request.param)


@pytest.fixture
def conn_info(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    """The broker table of this test's backend (Redis namespace or SQLite file of its own)."""
    if backend == "redis":
        return {
            "provider": "simplebroker",
            "URI": request.getfixturevalue("redis_url"),
            "NAMESPACE": request.getfixturevalue("namespace"),
            "LEASE_SECONDS": LEASE,
            "HEARTBEAT_SECONDS": HEARTBEAT,
            "RECOVER_SECONDS": 0.2,
        }
    return {
        "provider": "simplebroker",
        "URI": str(tmp_path / "broker.db"),
        "RECOVER_SECONDS": 0.2,
    }


@pytest.fixture
def make_broker(conn_info: dict[str, Any]) -> Iterator[Callable[..., SimpleBrokerBroker]]:
    """Factory: a new broker (its own domain) on this test's storage; kwargs override keys."""
    made: list[SimpleBrokerBroker] = []

    def make(**overrides: Any) -> SimpleBrokerBroker:
        domain = Domain(name="provider-tests")
        domain.config["brokers"]["default"] = {**conn_info, **overrides}
        broker = SimpleBrokerBroker("default", domain, domain.config["brokers"]["default"])
        made.append(broker)
        return broker

    yield make
    for broker in made:
        broker.close()


@pytest.fixture
def broker(make_broker: Callable[..., SimpleBrokerBroker]) -> SimpleBrokerBroker:
    """One broker on this test's storage."""
    return make_broker()


@pytest.fixture
def events(tmp_path: Path) -> Path:
    """The file the handlers of papp.py append their calls to."""
    path = tmp_path / "events.jsonl"
    path.touch()
    return path


@pytest.fixture
def worker_env(conn_info: dict[str, Any], events: Path) -> dict[str, str]:
    """Environment of processes running papp.py on this test's storage."""
    env = {
        **os.environ,
        "PYTHONPATH": PYTHONPATH,
        "PBK_URI": conn_info["URI"],
        "PBK_LOG": str(events),
    }
    env["PBK_RECOVER"] = str(conn_info["RECOVER_SECONDS"])
    if "NAMESPACE" in conn_info:
        env.update(
            PBK_NAMESPACE=conn_info["NAMESPACE"], PBK_LEASE=str(LEASE), PBK_HEARTBEAT=str(HEARTBEAT)
        )
    env.pop("PROTEAN_ENV", None)
    return env


@pytest.fixture
def start_worker(worker_env: dict[str, str], children: Children) -> Callable[..., Process]:
    """Start processes of pworker.py (``engine`` by default); all are killed afterwards.

    An engine is ready once it printed ``pworker ready`` (see ``wait_ready``).
    """

    def engine_ready(worker: Process) -> bool:
        return "pworker ready" in worker.output()

    def start(*args: str, env: dict[str, str] | None = None) -> Process:
        command = [sys.executable, str(HERE / "pworker.py"), *(args or ("engine",))]
        own = {**worker_env, **(env or {})}
        return children.start("worker", command, own, cwd=HERE, ready=engine_ready)

    return start
