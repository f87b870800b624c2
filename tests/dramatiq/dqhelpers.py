"""Starting ``dramatiq`` worker processes on ``dqapp`` and reading what they did."""

from __future__ import annotations

import os
import sys
from collections import Counter
from pathlib import Path

from support.eventlog import Event, read_events
from support.processes import Children, Process, pythonpath

HERE = Path(__file__).resolve().parent

#: The line a Dramatiq worker process logs once its consumers run.
READY_LINE = "is ready for action"


def start_worker(
    children: Children,
    url: str,
    namespace: str,
    log: Path,
    *,
    lease: float = 2.0,
    processes: int = 1,
    threads: int = 2,
    name: str = "worker",
) -> Process:
    """Start ``dramatiq dqapp --processes N --threads M``; wait until every process is ready."""
    env = {
        **os.environ,
        "PYTHONPATH": pythonpath(HERE),
        "DQ_URL": url,
        "DQ_NAMESPACE": namespace,
        "DQ_LOG": str(log),
        "DQ_LEASE": str(lease),
        "dramatiq_restart_delay": "500",
    }
    args = [sys.executable, "-m", "dramatiq", "dqapp", "--processes", str(processes)]
    args += ["--threads", str(threads)]
    process = children.start(
        name,
        args,
        env,
        ready=lambda proc: proc.output().count(READY_LINE) >= processes,
    )
    return process.wait_ready(90)


def group_pids(process: Process) -> set[int]:
    """Return the PIDs of ``process``'s group: the ``dramatiq`` main process and its workers."""
    pids = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[2]) == process.pid:
                pids.add(int(entry.name))
    return pids


def keys_of(log: Path, kind: str) -> Counter[str]:
    """Return how often each task key has an event of ``kind``."""
    return Counter(event.words[0] for event in read_events(log, kind))


def events(log: Path, kind: str | None = None) -> list[Event]:
    """Return the events of the log (only ``kind``'s)."""
    return read_events(log, kind)


def sender_actors(broker: object) -> tuple[object, object]:
    """Declare ``dqapp``'s actors on a test's broker (their bodies run only in the workers)."""
    import dramatiq

    def never(*args: object) -> None:
        raise AssertionError("dqapp's actors run in the worker processes")

    work = dramatiq.actor(never, actor_name="work", broker=broker, max_retries=0)
    spin = dramatiq.actor(never, actor_name="spin", broker=broker, max_retries=0)
    return work, spin
