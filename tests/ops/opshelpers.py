"""What the operations tests share: the module's namespace and processes, the dashboard, Chromium.

Waits, child processes and the event log come from ``tests/support``.
"""

from __future__ import annotations

import os
import shutil
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simplebroker_redis.devserver import free_port
from support.processes import Children, Process, pythonpath
from support.waiting import wait_for

#: This directory: the workers' apps (opsapps.py, opsprotean.py).
OPS_DIR = Path(__file__).resolve().parent
#: ``PYTHONPATH`` of the workers: their apps are in this directory.
PYTHONPATH = pythonpath(OPS_DIR)
#: The token of the dashboard with actions (``/?token=...`` logs a browser in).
TOKEN = "ops-token-1"
#: Headless Chromium in a container: no sandbox, no GPU, nothing fetched in the background.
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@dataclass
class Ops:
    """Everything one module's tests share."""

    url: str
    namespace: str
    dir: Path
    env: dict[str, str]
    children: Children

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
        return self.children.start(name, args, {**self.env, **env})


def worker_record(url: str, namespace: str, kind: str) -> dict[str, Any] | None:
    """The heartbeat record of a live worker of ``kind``, if one beats."""
    from simplebroker_redis import RedisRunner
    from simplebroker_redis.ops.observe import read_namespace

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
