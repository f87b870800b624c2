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

from collections.abc import Callable
from typing import Any, Final

from simplebroker_redis.tracing import TRACE_FIELDS, TaskSpans, opentelemetry

opentelemetry(__name__)  # fail at import, naming the extra, as any missing dependency does

__all__ = ["TRACE_HEADERS", "install"]

#: Message headers that carry the trace context.
TRACE_HEADERS: Final[tuple[str, ...]] = TRACE_FIELDS


class _Hooks:
    """The signal handlers of :func:`install`, around one :class:`TaskSpans`."""

    def __init__(self, spans: TaskSpans) -> None:
        self.spans = spans

    def before_publish(
        self, sender: Any = None, headers: Any = None, routing_key: Any = "", **_: Any
    ) -> None:
        if not isinstance(headers, dict) or "id" not in headers:
            return
        name, task_id = str(headers.get("task") or sender), str(headers["id"])
        headers.update(self.spans.send(task_id, name, str(routing_key or "")))

    def after_publish(self, headers: Any = None, **_: Any) -> None:
        if isinstance(headers, dict) and "id" in headers:
            self.spans.sent(str(headers["id"]))

    def prerun(self, task_id: str = "", task: Any = None, **_: Any) -> None:
        request = getattr(task, "request", None)
        fields = {}
        for name in TRACE_HEADERS:
            value = request.get(name) if request is not None else None
            if value:
                fields[name] = str(value)
        info = getattr(request, "delivery_info", None) or {}
        self.spans.process(task_id, task.name, str(info.get("routing_key") or ""), fields)

    def failure(self, task_id: str = "", exception: Any = None, **_: Any) -> None:
        if isinstance(exception, BaseException):
            self.spans.failed(task_id, exception)

    def postrun(self, task_id: str = "", **_: Any) -> None:
        self.spans.processed(task_id)


def install(app: Any, tracer_provider: Any = None) -> Callable[[], None]:
    """Trace every task ``app`` sends and runs (call where ``app`` is defined).

    Returns the function that disconnects the hooks again.
    """
    from celery import signals

    del app  # Celery's signals are process-wide; the argument documents the intent.
    hooks = _Hooks(TaskSpans("celery", tracer_provider))
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
