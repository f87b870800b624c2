"""One trace from ``send()`` to the worker: the send span and the run's span, joined."""

from __future__ import annotations

import dramatiq
import pytest

pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed")

from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)
from opentelemetry.trace import SpanKind, StatusCode  # noqa: E402

from dramatiq_simplebroker.tracing import TracingMiddleware  # noqa: E402
from support.waiting import wait_for  # noqa: E402


def test_a_send_and_its_run_are_one_trace(dq_broker, make_worker):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    dq_broker.add_middleware(TracingMiddleware(tracer_provider=provider))

    @dramatiq.actor(max_retries=0)
    def traced(fail):
        if fail:
            raise ValueError("no")

    traced.send(False)
    traced.send(True)
    make_worker(dq_broker)
    wait_for(lambda: len(exporter.get_finished_spans()) == 4, 30, "four spans")
    spans = exporter.get_finished_spans()
    sends = [s for s in spans if s.kind == SpanKind.PRODUCER]
    runs = [s for s in spans if s.kind == SpanKind.CONSUMER]
    assert {s.name for s in sends} == {"traced send"} and {s.name for s in runs} == {
        "traced process"
    }
    for run in runs:
        parent = next(
            s
            for s in sends
            if s.attributes["messaging.message.id"] == run.attributes["messaging.message.id"]
        )
        assert run.context.trace_id == parent.context.trace_id
        assert run.parent.span_id == parent.context.span_id
        assert run.attributes["dramatiq.task_name"] == "traced"
    assert {run.status.status_code for run in runs} == {StatusCode.UNSET, StatusCode.ERROR}


def test_lease_metrics_count_a_workers_renewals(dq_broker, make_worker):
    from prometheus_client import CollectorRegistry, generate_latest

    from dramatiq_simplebroker.metrics import LeaseMetrics

    registry = CollectorRegistry()
    metrics = LeaseMetrics(registry=registry)
    dq_broker.add_middleware(metrics)
    dq_broker.emit_after("process_boot")
    done = []

    @dramatiq.actor
    def hold():
        wait_for(lambda: metrics.counters.renewals._value.get() >= 2, 30, "two renewals")
        done.append(1)

    hold.send()
    make_worker(dq_broker)
    wait_for(lambda: done, 60, "the task")
    text = generate_latest(registry).decode()
    assert "simplebroker_lease_renewals_total" in text
    assert "simplebroker_leases_lost_total 0.0" in text
    dq_broker.emit_before("process_stop")
