"""Helpers of the Protean provider's tests: paths, waits, worker processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
SRC = HERE.parents[1] / "src"
PYTHONPATH = os.pathsep.join([str(HERE), str(SRC), str(SRC / "integrations")])

#: Lease settings of the Redis tests: short, so recovery after a kill is quick.
LEASE = 2.0
HEARTBEAT = 0.3


def read_events(path: Path) -> list[dict[str, Any]]:
    """Return the handler calls logged so far."""
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def wait_for(check: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    """Return ``check()`` once it is truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


class Worker:
    """A process running Protean's engine on papp (see pworker.py)."""

    def __init__(self, env: dict[str, str], log: Path, *args: str) -> None:
        self.log = log
        self._out = log.open("w")
        self.process = subprocess.Popen(
            [sys.executable, str(HERE / "pworker.py"), *args],
            env=env,
            cwd=str(HERE),
            stdout=self._out,
            stderr=subprocess.STDOUT,
        )

    @property
    def pid(self) -> int:
        """Return the process ID."""
        return self.process.pid

    def output(self) -> str:
        """Return what the process printed so far."""
        return self.log.read_text()

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until the engine announced itself (fail if the process exited)."""

        def ready() -> bool:
            if self.process.poll() is not None:
                pytest.fail(f"worker exited {self.process.returncode}:\n{self.output()}")
            return "pworker ready" in self.output()

        wait_for(ready, timeout, "the worker to start")

    def kill(self) -> None:
        """SIGKILL the process and reap it."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(30)

    def close(self) -> None:
        """Close the output file."""
        self._out.close()
