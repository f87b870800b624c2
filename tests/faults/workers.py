"""Real ``taskiq worker`` processes running tests/faults/tq_app.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def start_worker(url: str, namespace: str, log: Path, output: Path) -> subprocess.Popen[bytes]:
    """Start ``taskiq worker tq_app:broker`` (one process, three tasks at once) in a new group."""
    env = {
        **os.environ,
        "PYTHONPATH": str(HERE),  # tq_app.py
        "SIMPLEBROKER_REDIS_URL": url,
        "FAULTS_NAMESPACE": namespace,
        "FAULTS_LOG": str(log),
    }
    with output.open("ab") as out:
        return subprocess.Popen(
            # Three tasks at a time (and three reserved ahead): a kill lands
            # while the victim holds some, not after it ran the whole queue.
            [
                sys.executable,
                "-m",
                "taskiq",
                "worker",
                "tq_app:broker",
                "--workers",
                "1",
                "--max-async-tasks",
                "3",
            ],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def stop_group(process: subprocess.Popen[bytes] | None, sig: int = signal.SIGTERM) -> None:
    """Signal the worker's whole process group; SIGKILL it if it does not exit in 10 s."""
    if process is None or process.poll() is not None:
        return
    try:
        os.killpg(process.pid, sig)
    except ProcessLookupError:
        return
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)


def events(log: Path) -> list[tuple[str, str, int]]:
    """Return the (event, task key, pid) lines tq_app's tasks appended to ``log``."""
    if not log.exists():
        return []
    return [
        (event, key, int(pid))
        for event, key, pid in (line.split() for line in log.read_text().splitlines())
    ]
