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

from typing import Any, Final

from taskiq.abc.middleware import TaskiqMiddleware
from taskiq.message import TaskiqMessage
from taskiq.result import TaskiqResult

from simplebroker_redis.tracing import TRACE_FIELDS, TaskSpans, opentelemetry

opentelemetry(__name__)  # fail at import, naming the extra, as any missing dependency does

__all__ = ["TRACE_LABELS", "TracingMiddleware"]

#: Labels that carry the trace context inside a message.
TRACE_LABELS: Final[tuple[str, ...]] = TRACE_FIELDS


class TracingMiddleware(TaskiqMiddleware):
    """A span per enqueue and per delivery, one trace from ``kiq()`` to the worker.

    Args:
        tracer_provider: Where spans go (default: the global provider).

    """

    def __init__(self, tracer_provider: Any = None) -> None:
        super().__init__()
        self._spans = TaskSpans("taskiq", tracer_provider)

    def _queue(self, message: TaskiqMessage) -> str:
        # The broker's routing: the queue_name label, else the broker's queue.
        return str(message.labels.get("queue_name") or getattr(self.broker, "queue", ""))

    def pre_send(self, message: TaskiqMessage) -> TaskiqMessage:
        """Open the send span and put its context into the message's labels."""
        fields = self._spans.send(message.task_id, message.task_name, self._queue(message))
        message.labels.update(fields)
        return message

    def post_send(self, message: TaskiqMessage) -> None:
        """End the send span (the message is stored)."""
        self._spans.sent(message.task_id)

    def pre_execute(self, message: TaskiqMessage) -> TaskiqMessage:
        """Open the process span as a child of the sender's (current while the task runs)."""
        labels = message.labels
        fields = {name: str(labels[name]) for name in TRACE_LABELS if name in labels}
        self._spans.process(message.task_id, message.task_name, self._queue(message), fields)
        return message

    def on_error(
        self, message: TaskiqMessage, result: TaskiqResult[Any], exception: BaseException
    ) -> None:
        """Record the task's exception on its process span."""
        self._spans.failed(message.task_id, exception)

    def post_execute(self, message: TaskiqMessage, result: TaskiqResult[Any]) -> None:
        """End the process span."""
        self._spans.processed(message.task_id)
