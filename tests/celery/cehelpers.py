"""Helpers for the Celery integration tests: worker processes and the event log."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

HERE = Path(__file__).resolve().parent
# Worker processes import the test app (celeryapp.py) from this directory.
PYTHONPATH = os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])

T = TypeVar("T")


@dataclass(frozen=True)
class Event:
    """One line of the event log: time, process, kind, words."""

    at: float
    pid: int
    kind: str
    words: tuple[str, ...]


def read_events(log: Path) -> list[Event]:
    if not log.exists():
        return []
    events = []
    for line in log.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 3:
            events.append(Event(float(parts[0]), int(parts[1]), parts[2], tuple(parts[3:])))
    return events


def wait_for(predicate: Callable[[], T], timeout: float, what: str, interval: float = 0.05) -> T:
    """Poll ``predicate`` until it returns something truthy (generous timeouts: busy CI)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


class CeleryWorker:
    """One ``celery worker`` process group running tests/celery/celeryapp.py."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], out: Path) -> None:
        self.name = name
        self.out = out
        with out.open("ab") as stream:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "celeryapp", *args],
                env=env,
                stdout=stream,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        return self.process.pid

    def wait_ready(self, log: Path, timeout: float = 60.0) -> CeleryWorker:
        """Wait for the worker_ready signal's line (never a fixed sleep)."""

        def ready() -> bool:
            if self.process.poll() is not None:
                raise AssertionError(f"worker {self.name} exited:\n{self.output()}")
            return any(e.kind == "ready" and e.pid == self.pid for e in read_events(log))

        wait_for(ready, timeout, f"worker {self.name} to be ready")
        return self

    def kill(self) -> None:
        """SIGKILL the whole group (main process and pool children)."""
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.process.wait(10)

    def stop(self, timeout: float = 20.0) -> int:
        """Warm shutdown (SIGTERM); SIGKILL when it hangs."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        return int(self.process.returncode)

    def output(self) -> str:
        return self.out.read_text(errors="replace")[-6000:]
