"""Worker metrics of a Celery worker on this transport, through Celery's own hooks.

``install(app)`` connects two of Celery's hooks:

- **events**: with task events on (``celery worker -E``), every worker
  heartbeat (Celery's ``heartbeat_sent`` signal) is followed by a
  ``worker-simplebroker`` event with the transport's lease counts
  (``renewals``, ``renew_failures``, ``leases_lost``, ``recovered``) and
  ``running`` (tasks executing now), so ``celery events`` and any event
  consumer see them beside ``worker-heartbeat``;
- **Prometheus** (the ``metrics`` extra), with ``port=``: once the worker
  is ready (``worker_ready``) its main process serves
  ``simplebroker_running_tasks`` and the ``simplebroker_lease_*`` counters
  that the Taskiq middleware serves too.

The lease heartbeat runs in the worker's main process (every pool), which is
also where Celery tracks the requests it handed to its pool, so both hooks
read one process.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from simplebroker_redis.workers import observe

logger = logging.getLogger("celery_simplebroker.metrics")

__all__ = ["EVENT_TYPE", "LeaseTally", "install"]

#: The type of the event sent after each worker heartbeat.
EVENT_TYPE = "worker-simplebroker"


class LeaseTally:
    """Lease heartbeat events of this process, counted (a ``LeaseObserver``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.renewals = 0
        self.renew_failures = 0
        self.leases_lost = 0
        self.recovered_messages = 0

    def renewed(self, kind: str, tokens: int) -> None:
        """Count one renewal."""
        with self._lock:
            self.renewals += 1

    def renew_failed(self, kind: str) -> None:
        """Count one failed beat."""
        with self._lock:
            self.renew_failures += 1

    def lost(self, kind: str, tokens: int) -> None:
        """Count lost reservations."""
        with self._lock:
            self.leases_lost += tokens

    def recovered(self, kind: str, messages: int) -> None:
        """Count recovered messages."""
        with self._lock:
            self.recovered_messages += messages

    def fields(self) -> dict[str, int]:
        """Return the counts, and the tasks running now, as event fields."""
        with self._lock:
            return {
                "renewals": self.renewals,
                "renew_failures": self.renew_failures,
                "leases_lost": self.leases_lost,
                "recovered": self.recovered_messages,
                "running": running_tasks(),
            }


def running_tasks() -> int:
    """Return how many tasks this worker is executing (Celery's active requests)."""
    from celery.worker import state

    return len(state.active_requests)


def install(app: Any, *, port: int | None = None, addr: str = "127.0.0.1") -> LeaseTally:
    """Send lease events after each worker heartbeat, and serve Prometheus metrics on ``port``.

    Call it in the module that defines ``app`` (every worker imports it).
    Returns the tally, which counts this process's heartbeat events.
    """
    from celery import signals

    tally = LeaseTally()
    observe(tally)

    def after_heartbeat(sender: Any = None, **_: Any) -> None:
        eventer = getattr(sender, "eventer", None)
        if eventer is not None and eventer.enabled:
            eventer.send(EVENT_TYPE, **tally.fields())

    signals.heartbeat_sent.connect(after_heartbeat, weak=False)
    if port is not None:

        def serve(**_: Any) -> None:
            _serve(tally, port, addr)

        signals.worker_ready.connect(serve, weak=False)
    app.simplebroker_lease_tally = tally
    return tally


def _serve(tally: LeaseTally, port: int, addr: str) -> None:
    try:
        import prometheus_client
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    except ImportError:  # pragma: no cover - depends on the install
        logger.warning("metrics not served: install the 'metrics' extra (prometheus-client)")
        return

    class Collector:
        def describe(self) -> list[Any]:
            return []

        def collect(self) -> Any:
            fields = tally.fields()
            running = GaugeMetricFamily("simplebroker_running_tasks", "Tasks executing now")
            running.add_metric([], fields["running"])
            yield running
            for name, key, text in (
                ("simplebroker_lease_renewals", "renewals", "Lease renew round trips"),
                ("simplebroker_lease_renew_failures", "renew_failures", "Failed beats"),
                ("simplebroker_leases_lost", "leases_lost", "Reservations recovered elsewhere"),
                ("simplebroker_recovered_messages", "recovered", "Messages recovered"),
            ):
                family = CounterMetricFamily(name, text)
                family.add_metric([], fields[key])
                yield family

    registry = prometheus_client.CollectorRegistry(auto_describe=False)
    registry.register(Collector())
    try:
        prometheus_client.start_http_server(port, addr=addr, registry=registry)
    except OSError as exc:
        logger.warning("metrics not served on %s:%d: %s", addr, port, exc)
