"""Real ``taskiq worker`` processes running tests/faults/tq_app.py, and the log its tasks write."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from support.eventlog import read_events
from support.processes import Process, pythonpath

HERE = Path(__file__).resolve().parent


def start_worker(url: str, namespace: str, log: Path, output: Path) -> Process:
    """Start ``taskiq worker tq_app:broker`` (one process, three tasks at once) in a new group."""
    env = {
        **os.environ,
        "PYTHONPATH": pythonpath(HERE),  # tq_app.py
        "SIMPLEBROKER_REDIS_URL": url,
        "FAULTS_NAMESPACE": namespace,
        "FAULTS_LOG": str(log),
    }
    # Three tasks at a time (and three reserved ahead): a kill lands while the
    # victim holds some, not after it ran the whole queue.
    args = ["worker", "tq_app:broker", "--workers", "1", "--max-async-tasks", "3"]
    return Process([sys.executable, "-m", "taskiq", *args], env, output)


def events(log: Path) -> list[tuple[str, str, int]]:
    """Return the (event, task key, pid) of every line tq_app's tasks appended to ``log``."""
    return [(event.kind, event.words[0], event.pid) for event in read_events(log)]
