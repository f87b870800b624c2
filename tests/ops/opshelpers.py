"""Helpers of the operations tests: processes, event logs, readiness waits.

One Taskiq worker, one Celery worker and one dashboard serve every test of
a module (module scope: starting them is what costs time). Chromium is
Debian's (``/usr/bin/chromium``, or ``$SIMPLEBROKER_REDIS_CHROMIUM``),
driven by Playwright without a browser download. With
``SIMPLEBROKER_REDIS_REQUIRE_BROWSER=1`` (CI) a missing browser fails the
tests instead of skipping them.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

HERE = Path(__file__).resolve().parent
PYTHONPATH = os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], timeout: float, what: str) -> T:
    """Poll ``predicate`` until it returns something truthy (generous: busy CI)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def events(log: Path, kind: str) -> list[list[str]]:
    """The event lines of ``kind`` that opsapps.py's tasks wrote (words after the kind)."""
    if not log.exists():
        return []
    out = []
    for line in log.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[2] == kind:
            out.append(parts[3:])
    return out


class Process:
    """A process group of the test (worker or dashboard), killed at the end."""

    def __init__(self, args: list[str], env: dict[str, str], out: Path) -> None:
        self.out = out
        with out.open("ab") as sink:
            self.process = subprocess.Popen(
                args, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
            )

    def output(self) -> str:
        return self.out.read_text(errors="replace")

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)


@dataclass
class Ops:
    """Everything one module's tests share."""

    url: str
    namespace: str
    dir: Path
    env: dict[str, str]
    processes: list[Process]

    @property
    def log(self) -> Path:
        return self.dir / "events.log"

    @property
    def spans(self) -> Path:
        return self.dir / "spans.jsonl"

    @property
    def marker(self) -> Path:
        return self.dir / "marker"

    def start(self, name: str, args: list[str], **env: str) -> Process:
        process = Process(args, {**self.env, **env}, self.dir / f"{name}.out")
        self.processes.append(process)
        return process


def worker_record(url: str, namespace: str, kind: str) -> dict[str, Any] | None:
    """The heartbeat record of a live worker of ``kind``, if one beats."""
    from simplebroker_redis import RedisRunner
    from simplebroker_redis.observe import read_namespace

    runner = RedisRunner(url, namespace=namespace)
    try:
        state = read_namespace(runner)
    finally:
        runner.shutdown()
    for worker in state.live_workers():
        if worker.info.get("kind") == kind:
            return {"id": worker.id, **worker.info}
    return None


def start_dashboard(ops: Ops, name: str, *extra: str) -> str:
    """Start a dashboard process on the module's namespace; return its base URL."""
    port = free_port()
    args = [sys.executable, "-m", "simplebroker_redis.dashboard", "--target", ops.url]
    args += ["--namespace", ops.namespace, "--port", str(port), *extra]
    process = ops.start(name, args)
    base = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        if not process.alive():
            raise AssertionError(process.output())
        try:
            with urllib.request.urlopen(base + "/static/app.css", timeout=2):
                return True
        except OSError:
            return False

    wait_for(answers, 60, "the dashboard")
    return base


def chromium_path() -> str | None:
    configured = os.environ.get("SIMPLEBROKER_REDIS_CHROMIUM")
    if configured:
        return configured
    return shutil.which("chromium")
