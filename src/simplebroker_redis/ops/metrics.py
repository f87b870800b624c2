"""Prometheus exporter of one namespace: ``python -m simplebroker_redis.metrics``.

Needs the ``metrics`` extra (``prometheus-client``). Every scrape reads
the namespace whole with ``depths.lua`` (see :mod:`.observe`): one round
trip however many queues it holds (``--page-size N``: one per N queues,
to bound how long one script holds the server), plus one ``HGETALL`` of
the counters the scripts keep. What a scrape serves:

- per queue: ``simplebroker_queue_messages{state=pending|reserved|delayed|claimed}``
  and ``simplebroker_queue_oldest_pending_age_seconds`` (age of the ID of
  the oldest claimable message: when it was first written);
- per dead-letter queue: ``simplebroker_dead_letter_messages`` (a queue
  whose name ends in ``.dead``, the dead-letter queue of a live
  reservation, one named by the counters, or ``--dead-letter-queue``);
- ``simplebroker_queues``, ``simplebroker_workers`` (live heartbeats);
- per queue, counters kept by the scripts themselves:
  ``simplebroker_messages_total{event=enqueued|delivered|acknowledged|
  released|recovered|dead_lettered}``;
- per task name (the task statistics the integrations keep, see
  :mod:`simplebroker_redis.tasks.stats`; one more round trip):
  ``simplebroker_tasks_total{task, event=enqueued|done|failed|retried}``, the
  execution-time histogram ``simplebroker_task_duration_seconds{task}`` and its
  recent percentiles
  ``simplebroker_task_duration_recent_seconds{task, quantile}`` (the last
  5 minutes). Task-name labels are bounded: the ``--max-task-names``
  busiest names (50 by default) have their own, the rest are added up
  under ``task="other"``;
- ``simplebroker_up`` (0 when the server could not be read, the rest
  omitted) and ``simplebroker_scrape_seconds``.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Final

from simplebroker_redis.calls.tasks import task_stats_read
from simplebroker_redis.runner import RedisRunner
from simplebroker_redis.taskrecord import EVENTS, TaskRecord, bucket_upper

from .cli import log_to_stderr, tool_parser, tool_target
from .observe import NamespaceState, read_namespace
from .task_summary import QUANTILES, by_name, top, totals

logger = logging.getLogger("simplebroker_redis.metrics")

#: Port of the exporter when none is given (unassigned in Prometheus's list).
DEFAULT_PORT: Final[int] = 9808

STATES: Final[tuple[str, ...]] = ("pending", "reserved", "delayed", "claimed")

#: Task names with labels of their own, by default (the rest: ``task="other"``).
DEFAULT_MAX_TASK_NAMES: Final[int] = 50

#: Minutes the recent percentiles cover.
RECENT_MINUTES: Final[int] = 5

#: The execution-time histogram's bucket bounds (seconds), Prometheus's usual ones
#: and longer: each run counts in the first bound at or above its recorded bucket's.
DURATION_BOUNDS: Final[tuple[float, ...]] = (
    *(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5),
    *(1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0),
)


def _require_prometheus() -> Any:
    try:
        import prometheus_client
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise SystemExit(
            "the exporter needs prometheus-client: install the 'metrics' extra "
            "(pip install './simplebroker-redis[metrics]')"
        ) from exc
    return prometheus_client


class NamespaceCollector:
    """A Prometheus collector that reads the namespace at every scrape.

    Args:
        runner: The runner of the namespace (its pool is the exporter's).
        page_size: Queues per round trip (0: all in one).
        dead_letter_queues: Queues to report as dead-letter queues whatever
            their name.

    """

    def __init__(
        self,
        runner: RedisRunner,
        *,
        page_size: int = 0,
        dead_letter_queues: Iterable[str] = (),
        max_task_names: int = DEFAULT_MAX_TASK_NAMES,
    ) -> None:
        self._runner = runner
        self._page_size = page_size
        self._dead = tuple(dead_letter_queues)
        self._max_names = max_task_names
        self.last: NamespaceState | None = None  #: the last reading (tests, the CLI's log)

    def describe(self) -> list[Any]:
        """Return no descriptions: the registry must not scrape at registration."""
        return []

    def collect(self) -> Iterator[Any]:
        """Read the namespace and yield its metric families."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        started = time.perf_counter()
        up = GaugeMetricFamily("simplebroker_up", "1 when the namespace could be read")
        try:
            state = read_namespace(
                self._runner, page_size=self._page_size, dead_letter_queues=self._dead
            )
        except Exception as exc:  # noqa: BLE001 - a scrape reports failure, never raises
            logger.warning("could not read %s: %s", self._runner.where, exc)
            up.add_metric([], 0)
            yield up
            return
        self.last = state
        up.add_metric([], 1)
        yield up
        ns = self._runner.keys.namespace
        messages = GaugeMetricFamily(
            "simplebroker_queue_messages",
            "Messages of a queue per state (pending: claimable now)",
            labels=["namespace", "queue", "state"],
        )
        age = GaugeMetricFamily(
            "simplebroker_queue_oldest_pending_age_seconds",
            "Age of the oldest claimable message of a queue (since it was first written)",
            labels=["namespace", "queue"],
        )
        dead = GaugeMetricFamily(
            "simplebroker_dead_letter_messages",
            "Messages waiting in a dead-letter queue",
            labels=["namespace", "queue"],
        )
        for depth in state.queues:
            for name in STATES:
                messages.add_metric([ns, depth.queue, name], getattr(depth, name))
            if depth.oldest_pending_us is not None:
                seconds = max(0.0, (state.now_us - depth.oldest_pending_us) / 1e6)
                age.add_metric([ns, depth.queue], seconds)
        for name in sorted(state.dead_letter_queues):
            held = state.queue(name)
            dead.add_metric([ns, name], 0 if held is None else held.pending + held.delayed)
        yield messages
        yield age
        yield dead
        yield _gauge("simplebroker_queues", "Queues holding any message", ns, len(state.queues))
        yield _gauge(
            "simplebroker_workers", "Workers whose heartbeat is live", ns, len(state.live_workers())
        )
        total = CounterMetricFamily(
            "simplebroker_messages",
            "Messages per queue and event, counted by the scripts on the server",
            labels=["namespace", "queue", "event"],
        )
        for (queue, event), value in sorted(state.counters.items()):
            total.add_metric([ns, queue, event], value)
        yield total
        try:
            yield from self._task_metrics(ns, state.now_us // 60_000_000)
        except Exception as exc:  # noqa: BLE001 - the queues' metrics are served anyway
            logger.warning("could not read the task statistics of %s: %s", self._runner.where, exc)
        yield _gauge(
            "simplebroker_scrape_round_trips",
            "Round trips the last scrape took",
            ns,
            state.round_trips,
        )
        yield _gauge(
            "simplebroker_scrape_seconds",
            "Seconds the last scrape took",
            ns,
            time.perf_counter() - started,
        )

    def _task_metrics(self, ns: str, minute: int) -> Iterator[Any]:
        """Yield the task-name metrics (one round trip: totals and the recent minutes)."""
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        page = self._runner.run(task_stats_read(minute - RECENT_MINUTES + 1, minute, totals=True))
        kept = top(totals(page), self._max_names)
        recent = top(by_name(page), self._max_names)
        counts = CounterMetricFamily(
            "simplebroker_tasks",
            "Tasks per name and event (enqueued, done, failed, retried), counted by the workers",
            labels=["namespace", "task", "event"],
        )
        durations = HistogramMetricFamily(
            "simplebroker_task_duration_seconds",
            "Execution time of the runs of a task name (bucket bounds within 19 %)",
            labels=["namespace", "task"],
        )
        for name, record in sorted(kept.items()):
            for event in EVENTS:
                counts.add_metric([ns, name, event], record.count(event))
            durations.add_metric([ns, name], _buckets(record), record.sum_us / 1e6)
        yield counts
        yield durations
        quantiles = GaugeMetricFamily(
            "simplebroker_task_duration_recent_seconds",
            f"Execution-time percentiles of the last {RECENT_MINUTES} minutes' runs",
            labels=["namespace", "task", "quantile"],
        )
        for name, record in sorted(recent.items()):
            for _, q in QUANTILES:
                value = record.percentile(q)
                if value is not None:
                    quantiles.add_metric([ns, name, str(q)], value)
        yield quantiles
        yield _gauge(
            "simplebroker_task_names",
            "Task names the namespace keeps statistics of",
            ns,
            len(page.totals),
        )


def _buckets(record: TaskRecord) -> list[tuple[str, float]]:
    """Return a record's runs as Prometheus's cumulative (le, count) buckets."""
    counts = [0] * len(DURATION_BOUNDS)
    for bucket, runs in record.hist.items():
        upper = bucket_upper(bucket)
        index = next(
            (i for i, bound in enumerate(DURATION_BOUNDS) if upper <= bound * 1.000001), None
        )
        if index is not None:
            counts[index] += runs
    out: list[tuple[str, float]] = []
    seen = 0
    for bound, count in zip(DURATION_BOUNDS, counts, strict=True):
        seen += count
        out.append((repr(bound), seen))
    out.append(("+Inf", record.runs))
    return out


def _gauge(name: str, documentation: str, namespace: str, value: float) -> Any:
    from prometheus_client.core import GaugeMetricFamily

    family = GaugeMetricFamily(name, documentation, labels=["namespace"])
    family.add_metric([namespace], value)
    return family


def build_parser() -> argparse.ArgumentParser:
    """Return the command line parser of the exporter."""
    parser = tool_parser(
        "python -m simplebroker_redis.metrics",
        "Serve Prometheus metrics of one simplebroker-redis namespace.",
        DEFAULT_PORT,
    )
    parser.add_argument("--bind", default="127.0.0.1", help="address to listen on")
    parser.add_argument(
        "--page-size",
        type=int,
        default=0,
        help="queues read per round trip (0, the default: all in one)",
    )
    parser.add_argument(
        "--max-task-names",
        type=int,
        default=DEFAULT_MAX_TASK_NAMES,
        metavar="N",
        help=f"task names with labels of their own (default {DEFAULT_MAX_TASK_NAMES}); "
        'the others are added up under task="other"',
    )
    parser.add_argument(
        "--dead-letter-queue",
        action="append",
        default=[],
        metavar="QUEUE",
        help="report QUEUE as a dead-letter queue (repeatable; names ending in .dead always are)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the exporter until interrupted."""
    args = build_parser().parse_args(argv)
    log_to_stderr()
    prometheus_client = _require_prometheus()
    if args.page_size < 0:
        print("--page-size must be 0 or more", file=sys.stderr)
        return 2
    if args.max_task_names < 1:
        print("--max-task-names must be 1 or more", file=sys.stderr)
        return 2
    target = tool_target(args)
    if target is None:
        return 2
    runner = target.runner()
    registry = prometheus_client.CollectorRegistry(auto_describe=False)
    registry.register(
        NamespaceCollector(
            runner,
            page_size=args.page_size,
            dead_letter_queues=args.dead_letter_queue,
            max_task_names=args.max_task_names,
        )
    )
    server, thread = prometheus_client.start_http_server(
        args.port, addr=args.bind, registry=registry
    )
    print(
        f"serving metrics of {target.describe()} (from {target.source}) on "
        f"http://{args.bind}:{server.server_port}/metrics",
        flush=True,
    )
    try:
        thread.join()
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
        runner.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
