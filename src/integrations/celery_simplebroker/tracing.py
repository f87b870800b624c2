"""OpenTelemetry spans for Celery tasks on this transport (the ``otel`` extra).

``install(app)`` connects Celery's publish and run signals: every
``send_task()``/``delay()`` runs in a ``PRODUCER`` span (``<task> send``)
whose trace context (W3C ``traceparent``/``tracestate``, through the
global propagator) goes into the message's headers, which this transport
stores with the message; the worker runs the task in a ``CONSUMER`` span
(``<task> process``) that continues that trace. Only ``opentelemetry-api``
is needed, and nothing else imports it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Final

try:
    from opentelemetry import context, propagate, trace
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError(
        "celery_simplebroker.tracing needs opentelemetry-api: install the 'otel' extra"
    ) from exc

__all__ = ["TRACE_HEADERS", "install"]

#: Message headers that carry the trace context.
TRACE_HEADERS: Final[tuple[str, ...]] = ("traceparent", "tracestate")

#: Most spans kept open between two signals of one task.
MAX_OPEN: Final[int] = 10_000


class _Spans:
    """Spans open between two signals, by (phase, task id)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: OrderedDict[tuple[str, str], tuple[Any, Any]] = OrderedDict()

    def keep(self, key: tuple[str, str], span: Any, token: Any = None) -> None:
        with self._lock:
            self._open[key] = (span, token)
            while len(self._open) > MAX_OPEN:
                _, (stale, _token) = self._open.popitem(last=False)
                stale.end()

    def get(self, key: tuple[str, str]) -> Any:
        with self._lock:
            held = self._open.get(key)
        return None if held is None else held[0]

    def pop(self, key: tuple[str, str]) -> tuple[Any, Any] | None:
        with self._lock:
            return self._open.pop(key, None)


def _attributes(name: str, task_id: str, queue: str, operation: str) -> dict[str, Any]:
    return {
        "messaging.system": "simplebroker",
        "messaging.operation.type": operation,
        "messaging.destination.name": queue,
        "messaging.message.id": task_id,
        "celery.task_name": name,
    }


class _Hooks:
    """The signal handlers of :func:`install`, around one tracer."""

    def __init__(self, tracer: Any) -> None:
        self.tracer = tracer
        self.spans = _Spans()

    def before_publish(
        self, sender: Any = None, headers: Any = None, routing_key: Any = "", **_: Any
    ) -> None:
        if not isinstance(headers, dict) or "id" not in headers:
            return
        name, task_id = str(headers.get("task") or sender), str(headers["id"])
        span = self.tracer.start_span(
            f"{name} send",
            kind=trace.SpanKind.PRODUCER,
            attributes=_attributes(name, task_id, str(routing_key or ""), "send"),
        )
        carrier: dict[str, str] = {}
        propagate.inject(carrier, context=trace.set_span_in_context(span))
        headers.update({k: v for k, v in carrier.items() if k in TRACE_HEADERS})
        self.spans.keep(("send", task_id), span)

    def after_publish(self, headers: Any = None, **_: Any) -> None:
        if isinstance(headers, dict) and "id" in headers:
            held = self.spans.pop(("send", str(headers["id"])))
            if held is not None:
                held[0].end()

    def prerun(self, task_id: str = "", task: Any = None, **_: Any) -> None:
        request = getattr(task, "request", None)
        carrier = {}
        for name in TRACE_HEADERS:
            value = request.get(name) if request is not None else None
            if value:
                carrier[name] = str(value)
        parent = propagate.extract(carrier) if carrier else context.get_current()
        info = getattr(request, "delivery_info", None) or {}
        span = self.tracer.start_span(
            f"{task.name} process",
            context=parent,
            kind=trace.SpanKind.CONSUMER,
            attributes=_attributes(
                task.name, task_id, str(info.get("routing_key") or ""), "process"
            ),
        )
        token = context.attach(trace.set_span_in_context(span))
        self.spans.keep(("process", task_id), span, token)

    def failure(self, task_id: str = "", exception: Any = None, **_: Any) -> None:
        span = self.spans.get(("process", task_id))
        if span is not None and isinstance(exception, BaseException):
            span.record_exception(exception)
            span.set_status(trace.Status(trace.StatusCode.ERROR, type(exception).__name__))

    def postrun(self, task_id: str = "", **_: Any) -> None:
        held = self.spans.pop(("process", task_id))
        if held is None:
            return
        span, token = held
        if token is not None:
            try:
                context.detach(token)
            except ValueError:  # ran in another context: nothing to restore
                pass
        span.end()


def install(app: Any, tracer_provider: Any = None) -> Callable[[], None]:
    """Trace every task ``app`` sends and runs (call where ``app`` is defined).

    Returns the function that disconnects the hooks again.
    """
    from celery import signals

    del app  # Celery's signals are process-wide; the argument documents the intent.
    hooks = _Hooks(trace.get_tracer("celery_simplebroker", tracer_provider=tracer_provider))
    connected = [
        (signals.before_task_publish, hooks.before_publish),
        (signals.after_task_publish, hooks.after_publish),
        (signals.task_prerun, hooks.prerun),
        (signals.task_failure, hooks.failure),
        (signals.task_postrun, hooks.postrun),
    ]
    for signal, handler in connected:
        signal.connect(handler, weak=False)

    def uninstall() -> None:
        for signal, handler in connected:
            signal.disconnect(handler)

    return uninstall
