"""The Taskiq and Celery apps of the operations tests (imported by their workers).

Configured by environment: ``SIMPLEBROKER_REDIS_URL``, ``OPS_NS`` (namespace),
``OPS_LOG`` (the event log, ``support.eventlog``, that tasks note events in),
``OPS_SPANS`` (file the worker's OpenTelemetry spans are written to, one JSON
object a line),
``OPS_TASKIQ_METRICS_PORT`` / ``OPS_CELERY_METRICS_PORT`` (Prometheus ports of
the workers), ``OPS_MARKER`` (the ``flaky`` task rejects its message while
this file is missing; ``quick`` returns at once, for bursts). The ``slow``
tasks run until the test creates
``release-<tag>`` beside the log (at most 60 s), so a test sees them
running however slow the machine is.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

from celery import Celery
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from taskiq import Context, TaskiqDepends

import celery_simplebroker  # noqa: F401 - registers the "simplebroker" transport
from celery_simplebroker import metrics as celery_metrics
from celery_simplebroker import tracing as celery_tracing
from support.eventlog import note
from taskiq_simplebroker import SimpleBrokerResultBackend, SimpleBrokerTaskiqBroker
from taskiq_simplebroker.metrics import LeaseMetricsMiddleware
from taskiq_simplebroker.tracing import TracingMiddleware

URL = os.environ.get("SIMPLEBROKER_REDIS_URL", "redis://127.0.0.1:6379/0")
NS = os.environ.get("OPS_NS", "ops")
LOG = os.environ.get("OPS_LOG", os.devnull)


class FileExporter(SpanExporter):
    """Writes finished spans to ``OPS_SPANS`` (the worker's side of a trace)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with open(self.path, "a", encoding="utf-8") as out:
            for span in spans:
                parent = span.parent
                out.write(
                    json.dumps(
                        {
                            "name": span.name,
                            "kind": span.kind.name,
                            "trace_id": f"{span.context.trace_id:032x}",
                            "span_id": f"{span.context.span_id:016x}",
                            "parent_id": f"{parent.span_id:016x}" if parent else None,
                            "attributes": dict(span.attributes or {}),
                        }
                    )
                    + "\n"
                )
        return SpanExportResult.SUCCESS


def provider() -> TracerProvider | None:
    path = os.environ.get("OPS_SPANS")
    if not path:
        return None
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(FileExporter(path)))
    return tracer_provider


def _port(name: str) -> int | None:
    value = os.environ.get(name)
    return int(value) if value else None


# -- Taskiq ------------------------------------------------------------------------
broker = SimpleBrokerTaskiqBroker(
    url=URL,
    namespace=NS,
    queue="taskiq",
    lease_seconds=2.0,
    heartbeat_interval=0.3,
)
broker.with_result_backend(SimpleBrokerResultBackend(runner=broker.runner, result_ex_time=600))
if os.environ.get("OPS_WORKER") == "taskiq":
    broker = broker.with_middlewares(
        LeaseMetricsMiddleware(
            metrics_path=Path(os.environ["OPS_METRICS_DIR"]),
            server_port=_port("OPS_TASKIQ_METRICS_PORT"),
            server_addr="127.0.0.1",
        ),
        TracingMiddleware(tracer_provider=provider()),
    )


def released(tag: str) -> bool:
    return (Path(LOG).parent / f"release-{tag}").exists()


@broker.task(task_name="ops.slow")
async def slow(tag: str) -> str:
    note(LOG, "taskiq-start", tag)
    deadline = time.monotonic() + 60
    while not released(tag) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    note(LOG, "taskiq-done", tag)
    return tag


@broker.task(task_name="ops.quick")
async def quick(n: int) -> int:
    await asyncio.sleep(0.01 * (n % 5))
    return n


@broker.task(task_name="ops.flaky")
async def flaky(tag: str, context: Annotated[Context, TaskiqDepends()]) -> str:
    if not Path(os.environ.get("OPS_MARKER", "/nonexistent")).exists():
        note(LOG, "taskiq-reject", tag)
        context.reject()
        return "rejected"
    note(LOG, "taskiq-ran", tag)
    return tag


# -- Celery ------------------------------------------------------------------------
app = Celery("opsapps")
app.conf.update(
    broker_url=f"simplebroker+{URL}",
    result_backend=f"simplebroker+{URL}",
    broker_transport_options={
        "namespace": NS,
        "lease_seconds": 4.0,
        "heartbeat_interval": 0.5,
        "recover_interval": 0.5,
    },
    result_backend_transport_options={"namespace": NS},
    task_acks_late=True,
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)
if os.environ.get("OPS_WORKER") == "celery":
    celery_metrics.install(app, port=_port("OPS_CELERY_METRICS_PORT"))
    celery_tracing.install(app, tracer_provider=provider())


@app.task(name="ops.celery_slow")
def celery_slow(tag: str) -> str:
    note(LOG, "celery-start", tag)
    deadline = time.monotonic() + 60
    while not released(tag) and time.monotonic() < deadline:
        time.sleep(0.05)
    note(LOG, "celery-done", tag)
    return tag
