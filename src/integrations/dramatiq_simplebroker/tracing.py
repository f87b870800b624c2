"""OpenTelemetry spans for Dramatiq messages on this broker (the ``otel`` extra).

:class:`TracingMiddleware` opens a ``PRODUCER`` span around every send
(``<actor> send``) and writes its trace context (W3C ``traceparent`` and
``tracestate``, through the globally configured propagator) into the
message's options, which travel inside the stored message. A worker
extracts it and runs the actor in a ``CONSUMER`` span (``<actor> process``)
whose parent is the sender's, so one trace runs from ``send()`` through
the worker, across processes and machines. The spans are the ones every
integration of this package makes (:class:`~simplebroker_redis.tracing.TaskSpans`).

Only ``opentelemetry-api`` is needed; without an SDK configured its tracer
does nothing. Nothing else in the package imports OpenTelemetry, so an
application that does not add this middleware pays nothing::

    broker.add_middleware(TracingMiddleware())
"""

from __future__ import annotations

from typing import Any

from dramatiq.common import q_name
from dramatiq.middleware import Middleware

from simplebroker_redis.tracing import TRACE_FIELDS, TaskSpans, opentelemetry

opentelemetry(__name__)  # fail at import, naming the extra, as any missing dependency does

__all__ = ["TracingMiddleware"]


class TracingMiddleware(Middleware):
    """A span per send and per run of a message, one trace from ``send()`` to the worker.

    Args:
        tracer_provider: Where spans go (default: the global provider).

    """

    def __init__(self, tracer_provider: Any = None) -> None:
        self._spans = TaskSpans("dramatiq", tracer_provider)

    def before_enqueue(self, broker: Any, message: Any, delay: Any) -> None:
        """Open the send span and put its context into the message's options."""
        fields = self._spans.send(
            message.message_id, message.actor_name, q_name(message.queue_name)
        )
        message.options.update(fields)

    def after_enqueue(self, broker: Any, message: Any, delay: Any) -> None:
        """End the send span (the message is stored)."""
        self._spans.sent(message.message_id)

    def before_process_message(self, broker: Any, message: Any) -> None:
        """Open the run's span as a child of the sender's (current while the actor runs)."""
        options = message.options
        fields = {name: str(options[name]) for name in TRACE_FIELDS if name in options}
        self._spans.process(
            message.message_id, message.actor_name, q_name(message.queue_name), fields
        )

    def after_process_message(
        self, broker: Any, message: Any, *, result: Any = None, exception: Any = None
    ) -> None:
        """Record the actor's exception, if any, and end the run's span."""
        if exception is not None:
            self._spans.failed(message.message_id, exception)
        self._spans.processed(message.message_id)

    def after_skip_message(self, broker: Any, message: Any) -> None:
        """End the run's span of a skipped message."""
        self._spans.processed(message.message_id)
