"""Processes the Protean tests start.

``python pworker.py engine``: Protean's engine running the ``papp`` domain
(both handlers, stream subscriptions, the provider from ``PBK_*``); it logs
``pworker ready`` once the engine's loop is about to run.

``python pworker.py take-and-die STREAM GROUP``: wait (up to 30 s) for a
message of the group, print ``took <identifier>``, and SIGKILL itself: a
consumer that dies holding a message (the crash loop of the tests). Exit
status 3 when nothing came.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time

import papp


def engine() -> None:
    """Run the engine until SIGTERM/SIGINT (or until killed)."""
    from protean.server import Engine

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    domain = papp.configure()
    with domain.domain_context():
        worker = Engine(domain)
        print("pworker ready", flush=True)
        worker.run()


def take_and_die(stream: str, group: str) -> None:
    """Reserve one message and die holding it."""
    domain = papp.configure()
    with domain.domain_context():
        broker = domain.brokers["default"]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            taken = broker.read_blocking(stream, group, "dier", timeout_ms=1000)
            if taken:
                print(f"took {taken[0][0]}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
    sys.exit(3)


if __name__ == "__main__":
    if sys.argv[1] == "engine":
        engine()
    else:
        take_and_die(sys.argv[2], sys.argv[3])
