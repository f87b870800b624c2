"""Worker metrics for Prometheus, as a Dramatiq middleware (the ``metrics`` extra).

:class:`LeaseMetrics` counts the lease heartbeat's events of each worker
process (:func:`simplebroker_redis.workers.observe`) in ``prometheus_client``
counters. Beside Dramatiq's own ``Prometheus`` middleware they need nothing
more: Dramatiq points ``prometheus_client`` at its multiprocess directory
(``prometheus_multiproc_dir``) before the workers start, so the counters of
every worker process add up and its exposition server (port 9191) serves
them with its own metrics. What they count:

- ``simplebroker_lease_renewals_total``: renew round trips of the
  process's heartbeat (each renews every reservation it holds);
- ``simplebroker_lease_renew_failures_total``: beats that failed (the
  server was unreachable; the heartbeat retries after 0.5 s);
- ``simplebroker_leases_lost_total``: held reservations that had expired
  and were recovered elsewhere before this process renewed them;
- ``simplebroker_recovered_messages_total``: messages of expired
  reservations (anyone's) this process's heartbeat put back to work.

The namespace's own depths and workers are the exporter's
(``python -m simplebroker_redis.metrics``); these are a worker's.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from dramatiq.middleware import Middleware

from simplebroker_redis.workers import observe

__all__ = ["LeaseMetrics"]


class _Counters:
    """The four counters of one registry (a ``LeaseObserver``)."""

    def __init__(self, prometheus: Any, registry: Any) -> None:
        def counter(name: str, text: str) -> Any:
            return prometheus.Counter(name, text, registry=registry)

        self.renewals = counter("simplebroker_lease_renewals", "Lease renew round trips")
        self.failures = counter("simplebroker_lease_renew_failures", "Heartbeat beats that failed")
        self.leases_lost = counter(
            "simplebroker_leases_lost", "Held reservations recovered elsewhere"
        )
        self.recovered_messages = counter(
            "simplebroker_recovered_messages", "Messages of expired reservations put back to work"
        )

    def renewed(self, kind: str, tokens: int) -> None:
        """Count one renewal."""
        self.renewals.inc()

    def renew_failed(self, kind: str) -> None:
        """Count one failed beat."""
        self.failures.inc()

    def lost(self, kind: str, tokens: int) -> None:
        """Count lost reservations."""
        self.leases_lost.inc(tokens)

    def recovered(self, kind: str, messages: int) -> None:
        """Count recovered messages."""
        self.recovered_messages.inc(messages)


class LeaseMetrics(Middleware):
    """Counts this worker process's lease heartbeat events (see the module docstring).

    Args:
        registry: The ``prometheus_client`` registry (default: the global
            one, which Dramatiq's ``Prometheus`` middleware serves).

    """

    def __init__(self, registry: Any = None) -> None:
        import prometheus_client  # the metrics extra: fail at construction, naming it

        self._prometheus = prometheus_client
        self._registry = registry if registry is not None else prometheus_client.REGISTRY
        self._lock = threading.Lock()
        self._counters: _Counters | None = None
        self._stop: Callable[[], None] | None = None

    @property
    def counters(self) -> Any:
        """Return the counters (made on the first worker boot of this process), or None."""
        return self._counters

    def after_process_boot(self, broker: Any) -> None:
        """Make the counters and hear the heartbeat's events (once per process)."""
        with self._lock:
            if self._counters is None:
                self._counters = _Counters(self._prometheus, self._registry)
                self._stop = observe(self._counters)

    def before_process_stop(self, broker: Any) -> None:
        """Stop hearing the heartbeat's events."""
        with self._lock:
            if self._stop is not None:
                self._stop()
                self._stop = None
