"""Plain SimpleBroker queues on the same Valkey/Redis namespace as the Taskiq app.

SimpleBroker's own API (and its ``broker`` command) work on the ``redis``
backend unchanged: a queue written here is visible to ``broker peek``, and a
Taskiq task is just another message in the namespace::

    SIMPLEBROKER_REDIS_URL=redis://127.0.0.1:6390/0 python simplebroker_queue.py
"""

from __future__ import annotations

import os

from simplebroker import BrokerTarget, Queue

URL = os.environ.get("SIMPLEBROKER_REDIS_URL", "redis://127.0.0.1:6390/0")


def run(show=print) -> None:
    """Write, peek and read a few messages of a plain queue."""
    target = BrokerTarget("redis", URL)  # the default namespace, as in .broker.toml
    queue = Queue("emails", db_path=target, persistent=True)
    try:
        for address in ("ada@example.com", "grace@example.com"):
            queue.write(f'{{"to": "{address}", "subject": "hello"}}')
        show(f"queue 'emails' holds {len(queue.peek_many(10))} messages; oldest: {queue.peek()}")
        while (message := queue.read()) is not None:
            show(f"read from 'emails': {message}")
    finally:
        queue.close()


if __name__ == "__main__":
    run()
