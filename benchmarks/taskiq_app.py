"""Taskiq brokers under test, the trivial task, and the worker-side probes.

Imported twice: by ``taskiq worker taskiq_app:broker`` (the worker builds
one broker from ``BENCH_TQ_*`` environment variables) and by the benchmark
process (which builds producer brokers with :func:`make_broker`).

A broker entry is one row of the Taskiq table; adding a broker means adding
one entry to :data:`ENTRIES` and a branch in :func:`make_broker`.

In the worker, :class:`SignalMiddleware` reports every saved task over a
local TCP socket (one short line; no Redis command), with the worker's count
of Redis round trips so far (:class:`common.ClientCounter`). Both cost the
same for every broker.
"""

from __future__ import annotations

import importlib
import inspect
import os
import socket
import time
from dataclasses import dataclass
from typing import Any

from taskiq import AsyncBroker, TaskiqMiddleware
from taskiq.abc.result_backend import AsyncResultBackend

#: Name every broker registers the task under (producer and worker agree).
TASK_NAME = "bench.noop"

#: Result keys expire after this many seconds (the benchmark never needs them later).
RESULT_TTL = 3600


@dataclass(frozen=True)
class Entry:
    """One broker in the comparison."""

    key: str  #: short id (environment, JSON)
    label: str  #: table row
    results: tuple[bool, ...] = (False, True)  #: the result settings it runs with


ENTRIES: tuple[Entry, ...] = (
    Entry("simplebroker", "taskiq_simplebroker (ours)"),
    Entry("redis-list", "taskiq-redis ListQueueBroker"),
    Entry("redis-stream", "taskiq-redis RedisStreamBroker"),
    Entry("redis-streams-pkg", "taskiq-redis-streams"),
    # The cost of priorities and of several queues, next to the plain queue
    # (results on only: the comparison is between these rows).
    Entry("simplebroker-nopri", "ours, priorities=False", (True,)),
    Entry("simplebroker-pri", "ours, priority labels 0-9", (True,)),
    Entry("simplebroker-3q", "ours, 3 queues, tasks spread", (True,)),
)

#: Queues the three-queue entry's worker listens on, in order (tasks are kicked round robin).
THREE_QUEUES: tuple[str, ...] = ("bench.a", "bench.b", "bench")


class NotAvailable(Exception):
    """The broker of an entry cannot be built here (missing or not importable)."""


async def noop(i: int) -> int:
    """The trivial task."""
    return i


def availability(entry: str) -> str | None:
    """Return None when ``entry`` can run here, else why not."""
    if entry.startswith("simplebroker"):
        try:
            _simplebroker_classes(importlib.import_module("taskiq_simplebroker"))
        except ImportError as exc:
            return f"taskiq_simplebroker does not import ({exc}); not available yet"
        except NotAvailable as exc:
            return str(exc)
        return None
    if entry == "redis-streams-pkg":
        try:
            _import_streams_pkg()
        except Exception as exc:  # noqa: BLE001 - any import failure means "skip"
            return (
                f"taskiq-redis-streams does not import ({type(exc).__name__}: {exc}); "
                "run `pip install -e '.[bench]'`"
            )
        return None
    try:
        import taskiq_redis  # noqa: F401 - import check only
    except ImportError as exc:
        return f"taskiq-redis is not installed ({exc}); run `pip install -e '.[bench]'`"
    return None


def make_broker(entry: str, url: str, key: str, results: bool) -> AsyncBroker:
    """Build the broker of ``entry`` on ``url``, isolated under ``key``.

    ``key`` is the queue/stream name (taskiq-redis) or the namespace (ours);
    ``results`` attaches the entry's Redis result backend.
    """
    if entry == "redis-list":
        from taskiq_redis import ListQueueBroker, RedisAsyncResultBackend

        broker: AsyncBroker = ListQueueBroker(url, queue_name=key)
        if results:
            broker = broker.with_result_backend(
                RedisAsyncResultBackend(url, result_ex_time=RESULT_TTL, prefix_str=key)
            )
    elif entry == "redis-stream":
        from taskiq_redis import RedisAsyncResultBackend, RedisStreamBroker

        broker = RedisStreamBroker(url, queue_name=key, consumer_group_name=f"{key}-group")
        if results:
            broker = broker.with_result_backend(
                RedisAsyncResultBackend(url, result_ex_time=RESULT_TTL, prefix_str=key)
            )
    elif entry == "redis-streams-pkg":
        streams = _import_streams_pkg()
        broker = streams.RedisStreamsBroker(url, queue_name="bench", namespace=key)
        if results:
            broker = broker.with_result_backend(
                streams.RedisAsyncResultBackend(url, result_ex_time=RESULT_TTL, prefix_str=key)
            )
    elif entry.startswith("simplebroker"):
        broker = _make_simplebroker(url, key, results, variant=entry)
    else:
        raise NotAvailable(availability(entry) or f"no broker for entry {entry!r}")
    broker.register_task(noop, task_name=TASK_NAME)
    return broker


# -- taskiq-redis-streams ------------------------------------------------------------------------


def _import_streams_pkg() -> Any:
    """Import taskiq-redis-streams 0.2.0 on the taskiq this project runs.

    Its result backend imports ``model_dump`` and ``model_validate`` from
    ``taskiq.compat``; taskiq 0.13 dropped them with pydantic 1 support. When
    they are missing they are put back exactly as taskiq 0.12 defined them for
    pydantic 2 (``model_dump(mode="json")`` and ``model_validate``), so every
    broker in the table runs on the same taskiq and redis-py.
    """
    import taskiq.compat

    if not hasattr(taskiq.compat, "model_dump"):
        taskiq.compat.model_dump = lambda instance: instance.model_dump(mode="json")
    if not hasattr(taskiq.compat, "model_validate"):
        taskiq.compat.model_validate = lambda cls, message: cls.model_validate(message)
    return importlib.import_module("taskiq_redis_streams")


# -- our integration -------------------------------------------------------------------------------


def _simplebroker_classes(module: Any) -> tuple[type, type | None]:
    """Return ``taskiq_simplebroker``'s broker and result-backend classes."""
    broker_cls = getattr(module, "SimpleBrokerTaskiqBroker", None)
    backend_cls = getattr(module, "SimpleBrokerResultBackend", None)
    if not (inspect.isclass(broker_cls) and issubclass(broker_cls, AsyncBroker)):
        raise NotAvailable("taskiq_simplebroker imports but exports no SimpleBrokerTaskiqBroker")
    if backend_cls is not None and not issubclass(backend_cls, AsyncResultBackend):
        backend_cls = None
    return broker_cls, backend_cls


class _Labeller(TaskiqMiddleware):
    """Producer side: gives the n-th kicked task a label cycling through ``values``."""

    def __init__(self, name: str, values: tuple[object, ...]) -> None:
        super().__init__()
        self.name = name
        self.values = values
        self.kicked = 0

    def pre_send(self, message: Any) -> Any:
        """Label the task about to be kicked."""
        message.labels[self.name] = self.values[self.kicked % len(self.values)]
        self.kicked += 1
        return message


def _make_simplebroker(url: str, key: str, results: bool, variant: str) -> AsyncBroker:
    """Build our broker the way docs/taskiq.md recommends.

    One namespace per entry; the result backend shares the broker's runner
    (one pool; in a worker the result is written in the acknowledgement's
    round trip). ``variant``: ``simplebroker`` (defaults: priorities on,
    unused), ``-nopri`` (``priorities=False``), ``-pri`` (tasks kicked with
    priorities 0-9 in turn), ``-3q`` (three queues, tasks kicked to each in
    turn).
    """
    broker_cls, backend_cls = _simplebroker_classes(importlib.import_module("taskiq_simplebroker"))
    options: dict[str, Any] = {"queue": "bench"}
    labeller = None
    if variant == "simplebroker-nopri":
        options["priorities"] = False
    elif variant == "simplebroker-pri":
        labeller = _Labeller("priority", tuple(range(10)))
    elif variant == "simplebroker-3q":
        options = {"queues": list(THREE_QUEUES)}
        labeller = _Labeller("queue_name", THREE_QUEUES)
    try:
        broker: Any = broker_cls(url, namespace=key, **options)
        if labeller is not None:
            broker.add_middlewares(labeller)
        if results:
            if backend_cls is None:
                raise NotAvailable("taskiq_simplebroker exports no SimpleBrokerResultBackend")
            broker = broker.with_result_backend(
                backend_cls(runner=broker.runner, result_ex_time=RESULT_TTL)
            )
    except TypeError as exc:
        raise NotAvailable(
            f"cannot build {broker_cls.__name__} ({exc}); adapt "
            "benchmarks/taskiq_app.py:_make_simplebroker to its constructor"
        ) from exc
    return broker


# -- worker side ---------------------------------------------------------------------------------


class SignalMiddleware(TaskiqMiddleware):
    """Report readiness and each saved task to the benchmark over a local socket.

    Every line carries this process's Redis round trips and commands so far
    and its CPU time (all threads), so the benchmark can take exact deltas
    between "ready" and the N-th saved task.
    """

    def __init__(self, port: int, tag: str, counter: Any) -> None:
        super().__init__()
        self.port = port
        self.tag = tag
        self.counter = counter
        self.sock: socket.socket | None = None

    def _send(self, kind: str) -> None:
        if self.sock is None:
            self.sock = socket.create_connection(("127.0.0.1", self.port))
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.sock.sendall(f"hello {self.tag} {os.getpid()}\n".encode())
        line = (
            f"{kind} {self.counter.round_trips} {self.counter.commands} {time.process_time_ns()}\n"
        )
        self.sock.sendall(line.encode())

    def startup(self) -> None:
        """Announce the worker once its broker starts (before it listens)."""
        if self.broker.is_worker_process:
            self._send("ready")

    def post_save(self, message: Any, result: Any) -> None:
        """One line per saved task."""
        self._send("done")


def _worker_broker() -> AsyncBroker | None:
    entry = os.environ.get("BENCH_TQ_ENTRY")
    if not entry:
        return None
    from common import ClientCounter

    counter = ClientCounter().install()
    built = make_broker(
        entry,
        os.environ["BENCH_TQ_URL"],
        os.environ["BENCH_TQ_KEY"],
        os.environ.get("BENCH_TQ_RESULTS") == "1",
    )
    built.add_middlewares(
        SignalMiddleware(int(os.environ["BENCH_TQ_SIGNAL"]), os.environ["BENCH_TQ_TAG"], counter)
    )
    return built


#: The worker's broker (``taskiq worker taskiq_app:broker``); None in the benchmark process.
broker = _worker_broker()
