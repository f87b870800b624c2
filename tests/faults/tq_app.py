"""The Taskiq app test_taskiq_kill.py runs under ``taskiq worker`` (set up by environment).

``FAULTS_NAMESPACE`` picks the trial's namespace, ``FAULTS_LOG`` the event
log (``support.eventlog``) a task notes ``start`` and ``done`` in, before
and after its work.
"""

from __future__ import annotations

import asyncio
import os

from support.eventlog import note
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

LOG = os.environ.get("FAULTS_LOG", os.devnull)


@broker.task(task_name="faults:work")
async def work(key: str, seconds: float) -> str:
    """Log the start, work for ``seconds``, log the end."""
    note(LOG, "start", key)
    await asyncio.sleep(seconds)
    note(LOG, "done", key)
    return key
