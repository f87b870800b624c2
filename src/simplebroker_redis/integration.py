"""What the framework integrations share: lease timing, their runners, task spans.

The Taskiq, Celery and Protean integrations each take their settings in
their own words (keyword arguments, ``broker_transport_options``, a
Protean broker table) and raise their own error types; what those settings
mean is decided here, once:

- :func:`lease_timing`: how long a worker's reservations live, how often
  its heartbeat renews them and recovers others' (defaults, and the rule
  that a heartbeat comes at least twice per lease);
- :class:`Target`: where a runner connects (a target URL and its backend
  options) and the one way an integration or a tool builds its runner;
- :class:`TaskSpans`: OpenTelemetry spans of tasks, one per send and one
  per run, joined by the trace context stored with the message (the
  ``otel`` extra; nothing imports OpenTelemetry unless a tracing module
  of an integration is imported).
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Final

from simplebroker import resolve_config

from .aio.runner import AsyncRedisRunner
from .keys import DEFAULT_NAMESPACE
from .options import BackendOptions
from .runner import RedisRunner
from .targets import redact_target
from .validation import number_problem

# -- lease timing ---------------------------------------------------------------------

#: Seconds a reservation lives without renewal: a dead worker's messages return after it.
DEFAULT_LEASE_SECONDS: Final[float] = 10.0

#: Most seconds between two renewals of a worker's heartbeat, when not given.
DEFAULT_HEARTBEAT_SECONDS: Final[float] = 2.0

#: Most seconds between two recovery passes over expired reservations, when not given.
DEFAULT_RECOVER_SECONDS: Final[float] = 1.0

#: Share of the lease a heartbeat interval takes when not given: four renewals per lease.
DEFAULT_HEARTBEAT_SHARE: Final[float] = 0.25

#: Largest share of the lease between two renewals: a renewal that fails once
#: (a blip, a failover) is retried while the lease still runs.
MAX_HEARTBEAT_SHARE: Final[float] = 0.5


@dataclass(frozen=True, slots=True)
class LeaseTiming:
    """How long a worker's reservations live, and how often its heartbeat acts."""

    lease_seconds: float = DEFAULT_LEASE_SECONDS  #: lifetime of a reservation without renewal
    heartbeat_seconds: float = DEFAULT_HEARTBEAT_SECONDS  #: between two renewals
    recover_seconds: float = DEFAULT_RECOVER_SECONDS  #: between two recovery passes


class TimingError(ValueError):
    """A lease timing is refused: ``name`` (the caller's word for it) must be ``problem``."""

    def __init__(self, name: str, problem: str, value: object) -> None:
        super().__init__(f"{name} must be {problem}")
        self.name = name
        self.problem = problem
        self.value = value


def _seconds(name: str, value: object) -> float:
    problem = number_problem(value, bound=0, side=">")
    if problem is not None:
        raise TimingError(name, problem, value)
    return float(value)  # type: ignore[arg-type] # a number, checked above


def lease_timing(
    lease: object = None,
    heartbeat: object = None,
    recover: object = None,
    *,
    names: tuple[str, str, str] = ("lease_seconds", "heartbeat_interval", "recover_interval"),
) -> LeaseTiming:
    """Return the checked timing of a worker; None takes the default.

    Defaults: the lease :data:`DEFAULT_LEASE_SECONDS`; the heartbeat a
    quarter of the lease, at most :data:`DEFAULT_HEARTBEAT_SECONDS`; the
    recovery passes as often as the heartbeat, at most every
    :data:`DEFAULT_RECOVER_SECONDS`. ``names`` are the caller's names of
    the three settings, for the error.

    Raises:
        TimingError: A value is not a finite number > 0, or the heartbeat
            interval is longer than half the lease.

    """
    lease_name, heartbeat_name, recover_name = names
    lease_s = _seconds(lease_name, DEFAULT_LEASE_SECONDS if lease is None else lease)
    if heartbeat is None:
        heartbeat = min(DEFAULT_HEARTBEAT_SECONDS, lease_s * DEFAULT_HEARTBEAT_SHARE)
    heartbeat_s = _seconds(heartbeat_name, heartbeat)
    if heartbeat_s > lease_s * MAX_HEARTBEAT_SHARE:
        raise TimingError(heartbeat_name, f"at most half of {lease_name} ({lease_s:g})", heartbeat)
    if recover is None:
        recover = min(DEFAULT_RECOVER_SECONDS, heartbeat_s)
    return LeaseTiming(lease_s, heartbeat_s, _seconds(recover_name, recover))


# -- where a runner connects ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Target:
    """Where a runner connects: a target URL, its backend options, and what named them.

    ``source`` (``url``, ``--target``, an environment variable, a config
    file's path) is for messages: a refused option says where it came from.
    """

    target: str
    options: Mapping[str, Any] = field(default_factory=dict)  #: ``[backend_options]``
    source: str = "url"

    def with_options(self, options: Mapping[str, Any]) -> Target:
        """Return this target with ``options`` over its own (a None value: not given)."""
        given = {name: value for name, value in options.items() if value is not None}
        return dataclasses.replace(self, options={**self.options, **given})

    def describe(self) -> str:
        """Return the target and namespace for messages and pages, any password replaced."""
        namespace = self.options.get("namespace") or DEFAULT_NAMESPACE
        return f"{redact_target(self.target)} namespace={namespace!r}"

    def runner(self, config: Mapping[str, Any] | None = None) -> RedisRunner:
        """Return a new runner of this target.

        ``config`` is SimpleBroker's (pool timeout, password); None reads the
        ``BROKER_*`` environment, as SimpleBroker's command line does.

        Raises:
            InvalidConfigError: A backend option is invalid (SimpleBroker's
                error, naming it).
            InvalidTarget: The target is malformed.

        """
        options = BackendOptions.parse(self.options)
        return RedisRunner(self.target, options, config=_config(config))

    def async_runner(self, config: Mapping[str, Any] | None = None) -> AsyncRedisRunner:
        """Return a new asyncio runner of this target (see :meth:`runner`)."""
        options = BackendOptions.parse(self.options)
        return AsyncRedisRunner(self.target, options, config=_config(config))


def _config(config: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return resolve_config(env=os.environ) if config is None else config


# -- task spans (the ``otel`` extra) ------------------------------------------------------

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
        framework: ``taskiq`` or ``celery``: names the tracer
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
