"""The Protean domain of the operations tests: ``python opsprotean.py`` runs its engine,
``python opsprotean.py publish TAG`` publishes one event (printing its identifier
and Protean's id of the message).

Configured by the environment of the other ops apps (``SIMPLEBROKER_REDIS_URL``,
``OPS_NS``, ``OPS_LOG``). One event, ``ReportRequested``, handled by
``Reporter``: it notes ``protean-start <tag>`` in the event log, waits until
the test creates ``release-<tag>`` beside it (at most 60 s), and notes
``protean-done <tag>``, so a test sees it running however slow the machine
is. The engine prints ``opsprotean ready`` when its loop is about to run.
"""

# No ``from __future__ import annotations``: Protean reads the field
# declarations (``tag: String()``) as live annotations.
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from protean import Domain, handle
from protean.fields import Identifier, String
from protean.utils.eventing import Message

from support.eventlog import note

domain = Domain(name="ops")
LOG = os.environ.get("OPS_LOG", os.devnull)
STREAM = "ops::report"


@domain.aggregate
class Report:
    title: String()


@domain.event(part_of=Report)
class ReportRequested:
    report_id: Identifier()
    tag: String()


@domain.event_handler(part_of=Report)
class Reporter:
    @handle(ReportRequested)
    def on_requested(self, event: ReportRequested) -> None:
        note(LOG, "protean-start", event.tag)
        release = Path(LOG).parent / f"release-{event.tag}"
        deadline = time.monotonic() + 60
        while not release.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        note(LOG, "protean-done", event.tag)


def configure() -> Domain:
    """Configure and initialize the domain from the environment (once per process)."""
    config = domain.config
    config["brokers"]["default"] = {
        "provider": "simplebroker",
        "URI": os.environ.get("SIMPLEBROKER_REDIS_URL", "redis://127.0.0.1:6379/0"),
        "NAMESPACE": os.environ.get("OPS_NS", "ops"),
        "LEASE_SECONDS": 4.0,
        "HEARTBEAT_SECONDS": 0.5,
    }
    server = config["server"]
    server["default_subscription_type"] = "stream"
    server["health"] = {"enabled": False}
    server["stream_subscription"]["blocking_timeout_ms"] = 1000
    domain.init(traverse=False)
    return domain


def report_message(tag: str) -> dict[str, Any]:
    """Return the broker message the outbox would publish for a requested report."""
    report = Report(title=tag)
    report.raise_(ReportRequested(report_id=report.id, tag=tag))
    return Message.from_domain_object(report._events[-1]).to_dict()


def publish(tag: str) -> None:
    """Publish a requested report; print its identifier and Protean's id of the message."""
    configure()
    with domain.domain_context():
        broker = domain.brokers["default"]
        message = report_message(tag)
        identifier = broker.publish(STREAM, message)
        print(identifier, message["metadata"]["headers"]["id"], flush=True)
        broker.close()


def engine() -> None:
    """Run the engine until SIGTERM/SIGINT (or until killed)."""
    from protean.server import Engine

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    configure()
    with domain.domain_context():
        worker = Engine(domain)
        print("opsprotean ready", flush=True)
        worker.run()


if __name__ == "__main__":
    if sys.argv[1:2] == ["publish"]:
        publish(sys.argv[2])
    else:
        engine()
