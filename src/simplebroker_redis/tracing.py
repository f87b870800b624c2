"""OpenTelemetry spans of tasks: one per send and one per run, joined across processes.

:class:`TaskSpans` serves the integrations' ``tracing`` modules (Taskiq's
middleware, Celery's signals, Dramatiq's middleware): the send span's trace
context is stored with the message, and the run continues that trace. Only
the ``otel`` extra's ``opentelemetry-api`` is needed, and nothing imports it
unless an integration's tracing module is imported.
"""

from __future__ import annotations

import importlib
import threading
from collections import OrderedDict
from collections.abc import Mapping
from types import ModuleType
from typing import Any, Final

#: Fields of a message that carry the trace context (W3C Trace Context).
TRACE_FIELDS: Final[tuple[str, ...]] = ("traceparent", "tracestate")

#: Most spans kept open at once: a send that raised never ends its span, so
#: the oldest are ended once this is exceeded.
MAX_OPEN_SPANS: Final[int] = 10_000


def opentelemetry(owner: str) -> tuple[ModuleType, ModuleType, ModuleType]:
    """Return OpenTelemetry's ``context``, ``propagate`` and ``trace`` modules.

    Raises:
        ImportError: ``opentelemetry-api`` is not installed (the message
            names the ``otel`` extra that ``owner`` needs).

    """
    try:
        return (
            importlib.import_module("opentelemetry.context"),
            importlib.import_module("opentelemetry.propagate"),
            importlib.import_module("opentelemetry.trace"),
        )
    except ImportError as exc:
        raise ImportError(f"{owner} needs opentelemetry-api: install the 'otel' extra") from exc


class TaskSpans:
    """The spans of one framework's tasks: a ``PRODUCER`` span per send, a ``CONSUMER`` per run.

    The send span's trace context goes into the message (through the
    global propagator); the run's span continues that trace, so one trace
    runs from the producer through the worker, across processes. Only
    ``opentelemetry-api`` is needed: without an SDK its tracer does
    nothing. Open spans are kept by (phase, task ID), under a lock (Celery
    signals come from any thread).

    Args:
        framework: ``taskiq``, ``celery`` or ``dramatiq``: names the tracer
            (``<framework>_simplebroker``) and the task name's attribute.
        tracer_provider: Where spans go (default: the global provider).

    """

    def __init__(self, framework: str, tracer_provider: Any = None) -> None:
        package = f"{framework}_simplebroker"
        self._context, self._propagate, self._trace = opentelemetry(package)
        self._tracer = self._trace.get_tracer(package, tracer_provider=tracer_provider)
        self._name_attribute = f"{framework}.task_name"
        self._lock = threading.Lock()
        self._open: OrderedDict[tuple[str, str], tuple[Any, Any]] = OrderedDict()

    def _start(self, phase: str, task_id: str, name: str, queue: str, parent: Any = None) -> Any:
        kind = self._trace.SpanKind.PRODUCER if phase == "send" else self._trace.SpanKind.CONSUMER
        attributes = {
            "messaging.system": "simplebroker",
            "messaging.operation.type": phase,
            "messaging.destination.name": queue,
            "messaging.message.id": task_id,
            self._name_attribute: name,
        }
        return self._tracer.start_span(
            f"{name} {phase}", context=parent, kind=kind, attributes=attributes
        )

    def _keep(self, key: tuple[str, str], span: Any, token: Any = None) -> None:
        with self._lock:
            self._open[key] = (span, token)
            while len(self._open) > MAX_OPEN_SPANS:
                _, (stale, _token) = self._open.popitem(last=False)
                stale.end()

    def send(self, task_id: str, name: str, queue: str) -> dict[str, str]:
        """Open the send span of ``task_id``; return the trace fields to store with it."""
        span = self._start("send", task_id, name, queue)
        carrier: dict[str, str] = {}
        self._propagate.inject(carrier, context=self._trace.set_span_in_context(span))
        self._keep(("send", task_id), span)
        return {key: value for key, value in carrier.items() if key in TRACE_FIELDS}

    def sent(self, task_id: str) -> None:
        """End the send span of ``task_id`` (the message is stored)."""
        with self._lock:
            held = self._open.pop(("send", task_id), None)
        if held is not None:
            held[0].end()

    def process(self, task_id: str, name: str, queue: str, fields: Mapping[str, str]) -> None:
        """Open the run's span, a child of the sender's (``fields``: the message's trace fields).

        It is the current span until :meth:`processed`, so the task's own
        spans nest in it.
        """
        context = self._context
        parent = self._propagate.extract(dict(fields)) if fields else context.get_current()
        span = self._start("process", task_id, name, queue, parent)
        token = context.attach(self._trace.set_span_in_context(span))
        self._keep(("process", task_id), span, token)

    def failed(self, task_id: str, exception: BaseException) -> None:
        """Record the exception of ``task_id``'s run on its span."""
        with self._lock:
            held = self._open.get(("process", task_id))
        if held is not None:
            span = held[0]
            span.record_exception(exception)
            status = self._trace.Status(self._trace.StatusCode.ERROR, type(exception).__name__)
            span.set_status(status)

    def processed(self, task_id: str) -> None:
        """End the run's span of ``task_id`` and restore the context before it."""
        with self._lock:
            held = self._open.pop(("process", task_id), None)
        if held is None:
            return
        span, token = held
        try:
            self._context.detach(token)
        except ValueError:  # the run ended in another context: nothing to restore
            pass
        span.end()
