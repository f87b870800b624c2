"""Fixtures for the Taskiq integration: client brokers and real worker processes."""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from tqhelpers import PYTHONPATH

from support.processes import Children, Process

if TYPE_CHECKING:
    from taskiq_simplebroker import SimpleBrokerTaskiqBroker


@pytest.fixture
def task_log(tmp_path: Path) -> Path:
    """The file tasks of workerapp.py append their events to."""
    return tmp_path / "tasks.log"


@pytest.fixture
def worker_env(redis_url: str, namespace: str, task_log: Path) -> dict[str, str]:
    """Environment for workerapp.py: this test's server, namespace and log."""
    return {
        **os.environ,
        "PYTHONPATH": PYTHONPATH,
        "SIMPLEBROKER_REDIS_URL": redis_url,
        "TQ_NAMESPACE": namespace,
        "TQ_LOG": str(task_log),
    }


@pytest.fixture
def start_worker(worker_env: dict[str, str], children: Children) -> Callable[..., Process]:
    """Start ``taskiq worker workerapp:broker`` processes; all are killed afterwards."""

    def start(
        *extra: str,
        env: dict[str, str] | None = None,
        command: str = "worker",
        target: str | None = None,
    ) -> Process:
        if target is None:
            target = "workerapp:broker" if command == "worker" else "workerapp:scheduler"
        args = [command, target, *extra]
        if command == "worker" and "--workers" not in extra:
            args += ["--workers", "1"]
        taskiq = [sys.executable, "-m", "taskiq", *args]
        return children.start(command, taskiq, {**worker_env, **(env or {})})

    return start


@pytest.fixture
async def client(redis_url: str, namespace: str) -> AsyncIterator[SimpleBrokerTaskiqBroker]:
    """A producer-side broker with a result backend, on this test's namespace."""
    from taskiq_simplebroker import SimpleBrokerResultBackend, SimpleBrokerTaskiqBroker

    broker = SimpleBrokerTaskiqBroker(redis_url, namespace=namespace)
    broker.with_result_backend(SimpleBrokerResultBackend(runner=broker.runner))
    await broker.startup()
    yield broker
    await broker.shutdown()


@pytest.fixture
async def schedulers(redis_url: str, namespace: str) -> AsyncIterator[list[Any]]:
    """Three schedule sources, as three ``taskiq scheduler`` processes would hold them."""
    from taskiq_simplebroker import SimpleBrokerScheduleSource

    made = [
        SimpleBrokerScheduleSource(redis_url, namespace=namespace, claim_seconds=0.5)
        for _ in range(3)
    ]
    yield made
    for source in made:
        await source.shutdown()
