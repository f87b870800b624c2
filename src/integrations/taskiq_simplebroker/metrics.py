"""Worker metrics for Prometheus, as a Taskiq middleware (the ``metrics`` extra).

:class:`LeaseMetricsMiddleware` follows the conventions of Taskiq's own
``PrometheusMiddleware``: metrics live in ``PROMETHEUS_MULTIPROC_DIR``
(``metrics_path``, by default ``<tmp>/taskiq_worker``, the same directory),
so the processes of ``taskiq worker --workers N`` add up, and a worker
process serves them over HTTP on ``server_port``. Next to Taskiq's
middleware, leave ``server_port`` unset: its server reads every metric of
the directory, these included. What it counts:

- ``simplebroker_running_tasks{task_name}``: tasks executing now;
- ``simplebroker_lease_renewals_total``: renew round trips of the
  process's lease heartbeat (each renews every reservation it holds);
- ``simplebroker_lease_renew_failures_total``: heartbeat beats that failed
  (the server was unreachable; the heartbeat retries after 0.5 s);
- ``simplebroker_leases_lost_total``: held reservations that had expired
  and were recovered by another process before this one renewed them;
- ``simplebroker_recovered_messages_total``: messages of expired
  reservations (anyone's) this process's heartbeat put back to work.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from tempfile import gettempdir
from typing import Any

from taskiq.abc.middleware import TaskiqMiddleware
from taskiq.message import TaskiqMessage
from taskiq.result import TaskiqResult

from simplebroker_redis.workers import observe

logger = logging.getLogger("taskiq_simplebroker.metrics")

__all__ = ["LeaseMetricsMiddleware"]


class _Counters:
    """Lease heartbeat events → Prometheus counters (a ``LeaseObserver``)."""

    def __init__(self, prometheus: Any) -> None:
        counter = prometheus.Counter
        self.renewals = counter(
            "simplebroker_lease_renewals", "Lease renew round trips of the worker's heartbeat"
        )
        self.failures = counter(
            "simplebroker_lease_renew_failures", "Heartbeat beats that failed (retried soon)"
        )
        self.lost_leases = counter(
            "simplebroker_leases_lost", "Held reservations recovered elsewhere before renewal"
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
        self.lost_leases.inc(tokens)

    def recovered(self, kind: str, messages: int) -> None:
        """Count recovered messages."""
        self.recovered_messages.inc(messages)


class LeaseMetricsMiddleware(TaskiqMiddleware):
    """Prometheus metrics of a Taskiq worker on this broker (see the module docstring).

    Args:
        metrics_path: The multiprocess directory (``PROMETHEUS_MULTIPROC_DIR``
            when set, else ``<tmp>/taskiq_worker``, as Taskiq's middleware).
        server_port: Serve the directory's metrics on this port from each
            worker process (None: Taskiq's ``PrometheusMiddleware`` serves them).
        server_addr: The address that server listens on.

    """

    def __init__(
        self,
        metrics_path: Path | None = None,
        server_port: int | None = None,
        server_addr: str = "0.0.0.0",  # noqa: S104 - Taskiq's convention; scraped from afar
    ) -> None:
        super().__init__()
        configured = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        path = metrics_path or (Path(configured) if configured else None)
        path = path or Path(gettempdir()) / "taskiq_worker"
        path.mkdir(parents=True, exist_ok=True)
        # Before prometheus_client is imported: it picks its value store then.
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(path)
        try:
            import prometheus_client
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise ImportError(
                "LeaseMetricsMiddleware needs prometheus-client: install the 'metrics' extra"
            ) from exc
        self._prometheus = prometheus_client
        self.running = prometheus_client.Gauge(
            "simplebroker_running_tasks",
            "Tasks executing now",
            ["task_name"],
            multiprocess_mode="livesum",
        )
        self.counters = _Counters(prometheus_client)
        self.server_port = server_port
        self.server_addr = server_addr
        self._unobserve: Any = None

    def startup(self) -> None:
        """Count the heartbeat's events, and serve the metrics, in worker processes."""
        if not self.broker.is_worker_process:
            return
        if self._unobserve is None:
            self._unobserve = observe(self.counters)
        if self.server_port is None:
            return
        from prometheus_client.multiprocess import MultiProcessCollector

        registry = self._prometheus.CollectorRegistry()
        MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        try:
            self._prometheus.start_http_server(
                self.server_port, addr=self.server_addr, registry=registry
            )
        except OSError as exc:  # another process of the worker serves it already
            logger.debug("metrics server not started: %s", exc)

    def shutdown(self) -> None:
        """Stop counting the heartbeat's events."""
        if self._unobserve is not None:
            self._unobserve()
            self._unobserve = None

    def pre_execute(self, message: TaskiqMessage) -> TaskiqMessage:
        """Count a task that starts."""
        self.running.labels(message.task_name).inc()
        return message

    def post_execute(self, message: TaskiqMessage, result: TaskiqResult[Any]) -> None:
        """Count a task that ended (returned or raised)."""
        self.running.labels(message.task_name).dec()
