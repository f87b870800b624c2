"""The Taskiq app test_taskiq_kill.py runs under ``taskiq worker`` (set up by environment).

``FAULTS_NAMESPACE`` picks the trial's namespace, ``FAULTS_LOG`` the file a
task appends ``start``/``done`` lines to before and after its work.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from taskiq_simplebroker import SimpleBrokerTaskiqBroker

#: Queue of the trial's tasks.
QUEUE = "work"

broker = SimpleBrokerTaskiqBroker(
    namespace=os.environ["FAULTS_NAMESPACE"],
    queue=QUEUE,
    prefetch=3,
    lease_seconds=1.0,
    heartbeat_interval=0.2,
    max_deliveries=None,
)

LOG = Path(os.environ.get("FAULTS_LOG", os.devnull))


def _log(event: str, key: str) -> None:
    with LOG.open("a", encoding="utf-8") as out:  # O_APPEND: whole lines across processes
        out.write(f"{event} {key} {os.getpid()}\n")


@broker.task(task_name="faults:work")
async def work(key: str, seconds: float) -> str:
    """Log the start, work for ``seconds``, log the end."""
    _log("start", key)
    await asyncio.sleep(seconds)
    _log("done", key)
    return key
