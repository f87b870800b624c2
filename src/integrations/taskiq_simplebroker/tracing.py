"""OpenTelemetry spans for Taskiq tasks on this broker (the ``otel`` extra).

:class:`TracingMiddleware` opens a ``PRODUCER`` span around every
``kiq()`` (``<task> send``) and writes its trace context (W3C
``traceparent``/``tracestate``, through the globally configured
propagator) into the task's labels, which travel inside the stored
message. A worker extracts it and runs the task in a ``CONSUMER`` span
(``<task> process``) whose parent is the producer's, so one trace runs
from ``kiq()`` through the worker, across processes and machines.

Only ``opentelemetry-api`` is needed; without an SDK configured its tracer
does nothing. Nothing else in the package imports OpenTelemetry, so an
application that does not add this middleware pays nothing.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Final

from taskiq.abc.middleware import TaskiqMiddleware
from taskiq.message import TaskiqMessage
from taskiq.result import TaskiqResult

try:
    from opentelemetry import context, propagate, trace
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError(
        "taskiq_simplebroker.tracing needs opentelemetry-api: install the 'otel' extra"
    ) from exc

__all__ = ["TRACE_LABELS", "TracingMiddleware"]

#: Labels that carry the trace context inside a message.
TRACE_LABELS: Final[tuple[str, ...]] = ("traceparent", "tracestate")

#: Most spans kept open between the hooks of one task (a send that raised
#: never reaches ``post_send``; the oldest are ended when this is exceeded).
MAX_OPEN: Final[int] = 10_000

SYSTEM: Final[str] = "simplebroker"


class TracingMiddleware(TaskiqMiddleware):
    """A span per enqueue and per delivery, one trace from ``kiq()`` to the worker.

    Args:
        tracer_provider: Where spans go (default: the global provider).

    """

    def __init__(self, tracer_provider: Any = None) -> None:
        super().__init__()
        self._tracer = trace.get_tracer("taskiq_simplebroker", tracer_provider=tracer_provider)
        self._open: OrderedDict[tuple[str, str], Any] = OrderedDict()

    def _keep(self, key: tuple[str, str], span: Any) -> None:
        self._open[key] = span
        while len(self._open) > MAX_OPEN:
            _, stale = self._open.popitem(last=False)
            (stale[0] if isinstance(stale, tuple) else stale).end()

    def _queue(self, message: TaskiqMessage) -> str:
        # The broker's routing: the queue_name label, else the broker's queue.
        return str(message.labels.get("queue_name") or getattr(self.broker, "queue", ""))

    def _attributes(self, message: TaskiqMessage, operation: str) -> dict[str, Any]:
        return {
            "messaging.system": SYSTEM,
            "messaging.operation.type": operation,
            "messaging.destination.name": self._queue(message),
            "messaging.message.id": message.task_id,
            "taskiq.task_name": message.task_name,
        }

    def pre_send(self, message: TaskiqMessage) -> TaskiqMessage:
        """Open the send span and put its context into the message's labels."""
        span = self._tracer.start_span(
            f"{message.task_name} send",
            kind=trace.SpanKind.PRODUCER,
            attributes=self._attributes(message, "send"),
        )
        carrier: dict[str, str] = {}
        propagate.inject(carrier, context=trace.set_span_in_context(span))
        for name in TRACE_LABELS:
            if name in carrier:
                message.labels[name] = carrier[name]
        self._keep(("send", message.task_id), span)
        return message

    def post_send(self, message: TaskiqMessage) -> None:
        """End the send span (the message is stored)."""
        span = self._open.pop(("send", message.task_id), None)
        if span is not None:
            span.end()

    def pre_execute(self, message: TaskiqMessage) -> TaskiqMessage:
        """Open the process span as a child of the sender's."""
        labels = message.labels
        carrier = {name: str(labels[name]) for name in TRACE_LABELS if name in labels}
        parent = propagate.extract(carrier) if carrier else context.get_current()
        span = self._tracer.start_span(
            f"{message.task_name} process",
            context=parent,
            kind=trace.SpanKind.CONSUMER,
            attributes=self._attributes(message, "process"),
        )
        # Current while the task runs (same asyncio task), so its own spans nest.
        token = context.attach(trace.set_span_in_context(span))
        self._keep(("process", message.task_id), (span, token))
        return message

    def on_error(
        self, message: TaskiqMessage, result: TaskiqResult[Any], exception: BaseException
    ) -> None:
        """Record the task's exception on its process span."""
        held = self._open.get(("process", message.task_id))
        if held is not None:
            span = held[0]
            span.record_exception(exception)
            span.set_status(trace.Status(trace.StatusCode.ERROR, type(exception).__name__))

    def post_execute(self, message: TaskiqMessage, result: TaskiqResult[Any]) -> None:
        """End the process span."""
        held = self._open.pop(("process", message.task_id), None)
        if held is not None:
            span, token = held
            try:
                context.detach(token)
            except ValueError:  # post_execute ran in another context: nothing to restore
                pass
            span.end()
