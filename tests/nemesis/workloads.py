"""What a workload is: how to start its workers, send it tasks and read their results.

The four workloads are in :mod:`.frameworks`. Each runs the suite's
existing worker apps (tests/taskiq/workerapp.py, tests/celery/celeryapp.py,
tests/protean/papp.py; the ``Queue`` consumer is :mod:`.queue_worker`):
a task notes ``start <key>`` and ``done <key>``
around ``task_seconds`` of work in its worker's own log, and returns
``[key, pid]``, so the stored result says which process wrote it.
Producers run in the test process; every connection of a process goes
through the URL it is given (its own fault proxy).
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

from support.processes import Process, pythonpath

from .history import Result

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Setup:
    """What every process of a run shares."""

    namespace: str
    folder: Path
    lease: float
    task_seconds: float
    #: A URL of the server that no fault touches (results are read through it).
    admin_url: str
    #: ``wait_replicas`` (WAIT after every state change) for everyone; 0: off.
    wait_replicas: int = 0
    #: Seconds that WAIT may take.
    wait_timeout: float = 0.5

    def durability(self) -> dict[str, float]:
        """Return the backend options ``wait_replicas``/``wait_timeout`` (empty when off)."""
        if not self.wait_replicas:
            return {}
        return {"wait_replicas": self.wait_replicas, "wait_timeout": self.wait_timeout}

    def durability_env(self, prefix: str) -> dict[str, str]:
        """Return ``<prefix>WAIT_REPLICAS``/``<prefix>WAIT_TIMEOUT`` for a worker app."""
        return {f"{prefix}{k.upper()}": str(v) for k, v in self.durability().items()}


@dataclass(frozen=True)
class Command:
    """How to start one worker: its command line, environment, and when it is ready."""

    args: list[str]
    env: dict[str, str]
    ready: Callable[[Process], object]
    cwd: Path | None = None


class Producer(Protocol):
    """Sends tasks: ``send(key)`` returns the framework's reference (or raises)."""

    def send(self, key: str) -> str:
        """Send the task ``key``; return its reference (a task ID, or the key)."""

    def close(self) -> None:
        """Release the producer's connections."""


class Workload:
    """One framework: its workers, its producer, its results (subclasses fill these in)."""

    name: ClassVar[str]
    #: Tasks one send stands for (Protean: one per consumer group).
    fanout: ClassVar[tuple[str, ...]] = ()
    #: Whether tasks store results that say who wrote them.
    results: ClassVar[bool] = False
    #: Queue names whose pending or reserved messages are the workload's tasks.
    queues: ClassVar[tuple[str, ...]] = ()

    def command(self, setup: Setup, name: str, url: str) -> Command:
        """Return how to start worker ``name`` on ``url`` (its log: ``<folder>/<name>.log``)."""
        raise NotImplementedError

    def producer(self, setup: Setup, url: str) -> Producer:
        """Return a producer on ``url``."""
        raise NotImplementedError

    def read_results(self, setup: Setup, refs: dict[str, str]) -> dict[str, Result]:
        """Return the stored result of each task (key: reference), read through ``admin_url``."""
        return {}

    def holds(self, queue: str) -> bool:
        """Return whether messages of ``queue`` are this workload's tasks."""
        return queue in self.queues


def base_env(setup: Setup, folders: list[Path]) -> dict[str, str]:
    """Return a worker's environment: ``PYTHONPATH`` with ``folders``, no inherited PBK/TQ vars."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TQ_", "PBK_", "CELERY_"))}
    env["PYTHONPATH"] = pythonpath(*folders)
    return env


def output_says(text: str) -> Callable[[Process], bool]:
    """Return a readiness check: the process printed ``text``."""
    return lambda process: text in process.output()


class LoopThread:
    """An event loop in a thread, for producers and result readers of asyncio frameworks."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run ``coro`` on the loop and return its result (blocks the caller)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def close(self) -> None:
        """Stop the loop and its thread."""
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


def witnessed(value: Any, key: str) -> tuple[int | None, bool]:
    """Return (pid, right) of a ``[key, pid]`` result value."""
    if isinstance(value, list | tuple) and len(value) == 2 and value[0] == key:
        return int(value[1]), True
    return None, False
