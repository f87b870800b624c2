"""A consumer of SimpleBroker's ``Queue`` as a user writes one: at-least-once batches.

``python queue_worker.py`` reads ``NEMESIS_URL``, ``NEMESIS_NS``, ``NEMESIS_LOG``
(its event log), ``NEMESIS_LEASE`` (the runner's ``stale_batch_seconds``:
the lease of a batch), ``NEMESIS_TASK_SECONDS`` and, optionally,
``NEMESIS_WAIT_REPLICAS`` and ``NEMESIS_WAIT_TIMEOUT``. It takes batches of four
with ``read_generator(delivery_guarantee="at_least_once")``, notes
``start <key> <message id>`` and ``done <key> <message id>`` around the
work of each message, and commits a batch after its last message; a
failure (server unreachable, a batch whose lease was lost) is noted as
``error`` and the loop reads again, as a worker loop does.
"""

from __future__ import annotations

import os
import time

from simplebroker import Queue, resolve_config

from simplebroker_redis import RedisRunner
from support.eventlog import note

#: The queue the nemesis producer writes to.
QUEUE = "work"
#: Messages per at-least-once batch: small, so a fault finds a batch half done.
BATCH = 4


def durability() -> dict[str, float]:
    """Return ``wait_replicas``/``wait_timeout`` from NEMESIS_WAIT_REPLICAS/_TIMEOUT (none: off)."""
    if not os.environ.get("NEMESIS_WAIT_REPLICAS"):
        return {}
    return {
        "wait_replicas": int(os.environ["NEMESIS_WAIT_REPLICAS"]),
        "wait_timeout": float(os.environ.get("NEMESIS_WAIT_TIMEOUT", "1.0")),
    }


def main() -> None:
    """Consume until killed."""
    log = os.environ["NEMESIS_LOG"]
    seconds = float(os.environ.get("NEMESIS_TASK_SECONDS", "0.1"))
    runner = RedisRunner(
        os.environ["NEMESIS_URL"],
        namespace=os.environ["NEMESIS_NS"],
        stale_batch_seconds=float(os.environ["NEMESIS_LEASE"]),
        **durability(),
    )
    queue = Queue(
        QUEUE,
        db_path=runner.broker_target,
        runner=runner,
        persistent=True,
        config=resolve_config(override={"BROKER_GENERATOR_BATCH_SIZE": BATCH}),
    )
    print("queue worker ready", flush=True)
    while True:
        took = 0
        try:
            messages = queue.read_generator(
                with_timestamps=True, delivery_guarantee="at_least_once"
            )
            for body, message_id in messages:
                note(log, "start", body, message_id)
                time.sleep(seconds)
                note(log, "done", body, message_id)
                took += 1
        except Exception as exc:  # noqa: BLE001 - a worker loop logs and reads again
            note(log, "error", type(exc).__name__, str(exc).replace("\n", " ")[:200])
            time.sleep(0.2)
        if not took:
            time.sleep(0.05)  # the queue was empty: poll again soon


if __name__ == "__main__":
    main()
